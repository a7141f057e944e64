"""Studies: a plan in YAML (conf/study/NAME.yaml) carried out stage by stage, resumably (python -m altgrad.study)."""
