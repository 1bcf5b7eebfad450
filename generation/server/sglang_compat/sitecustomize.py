"""Run by Python at start-up in every process of the SGLang server (this folder is on their
PYTHONPATH, spawned scheduler processes included): installs the import hook of
``cpu_prefix_attention`` and nothing else. See README.md in this folder."""

from cpu_prefix_attention.hook import install

install()
