"""Job dir names: a sweep's job dir is named by its overrides (``format=e4m3,seed=1``), made one folder level.

A value holding ``/`` (``data.path=/a/b.txt``) would nest the job dir in folders of its own, and a very long one
would exceed a file name's 255 bytes. ``${altgrad.job_dir:${hydra.job.override_dirname}}``
(conf/experiment/_base/sweep.yaml) percent-encodes ``%`` and ``/`` and shortens a long name to its head plus a hash,
the same on every rerun, so ``+resume_sweep=true`` finds its jobs again. Importing this module registers the resolver
(the command line, the sweep's workers and the sweep planner import it).
"""

from __future__ import annotations

import hashlib

from omegaconf import OmegaConf

RESOLVER = "altgrad.job_dir"
MAX_BYTES = 200  # below NAME_MAX (255) with room for what a launcher adds


def job_dirname(text: str) -> str:
    """`text` as one folder name: ``%`` → ``%25``, ``/`` → ``%2F``; longer than MAX_BYTES: its head and a hash."""
    name = str(text).replace("%", "%25").replace("/", "%2F")
    if name in ("", ".", ".."):
        name = name.replace(".", "%2E") or "_"
    if len(name.encode()) > MAX_BYTES:
        digest = hashlib.sha256(name.encode()).hexdigest()[:12]
        head = name.encode()[: MAX_BYTES - 14].decode(errors="ignore")
        name = f"{head}~{digest}"
    return name


if not OmegaConf.has_resolver(RESOLVER):
    OmegaConf.register_new_resolver(RESOLVER, job_dirname)
