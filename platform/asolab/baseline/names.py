"""The control arms' names, the registry ``asolab baseline --arms`` reads (light to
import: the CLI's help needs them, and must not wait for torch)."""

from __future__ import annotations

GENOTYPES = ("scratch", "random", "initial")  # which fixed genotype an arm trains
FINAL_ONLY = "-final"  # the suffix of an arm that trains the final stage's epochs only
ARMS = (*GENOTYPES, *(g + FINAL_ONLY for g in GENOTYPES))  # the registry of control arms
DEFAULT_ARMS = GENOTYPES
