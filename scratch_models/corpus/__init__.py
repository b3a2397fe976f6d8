"""Activations over a corpus: `harvest` writes them to disk as Arrow shards (resumable, several processes under
torchrun), `iter_activations` hands them over batch by batch. Needs Hugging Face `datasets`
(`pip install 'scratch-models[harvest]'`); not imported by `import scratch_models`.
"""

from .harvest import Interrupted, Summary, Threads, harvest, iter_activations, run_harvest
from .reading import Corpus, CorpusError, Document
from .storage import DiskFull, HarvestError, as_bfloat16

__all__ = ["Corpus", "CorpusError", "DiskFull", "Document", "HarvestError", "Interrupted", "Summary", "Threads",
           "as_bfloat16", "harvest", "iter_activations", "run_harvest"]
