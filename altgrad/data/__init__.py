"""Training text: the embedded legal-register corpus, Hugging Face datasets and local files, as cached tokens.

Modules: corpus (the grammar), tokenizer (tiktoken encodings), sources (where text comes from), datamodule (the
LightningDataModule, `altgrad.data.datamodule.TextDataModule`). Kept import-light: nothing heavy loads here.
"""
