"""Foreign config formats read as a pure dict-to-dict pre-pass before the core loader validates.

cosmos-rl's LLM / VLM files (:mod:`.cosmos_rl`, driven by the one typed rule list in :mod:`.rules`)
and its world-model files (:mod:`.cosmos_rl_wfm`) become trees of this library's keys; the core
loader (``config/loader.py``) then applies overrides and validates once.
"""
