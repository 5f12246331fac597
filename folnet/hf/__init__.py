"""folnet in the Hugging Face stack (the ``[hf]`` extra: transformers).

Importing this module registers `FolnetConfig` (model_type "folnet") and the model classes
with the Auto classes, so ``AutoConfig``, ``AutoModel``, ``AutoModelForSequenceClassification``,
... load a directory saved by `folnet.save_pretrained` (or by these classes). The classes wrap
the native modules -- same state-dict keys, no copy of the architecture.
"""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForMultipleChoice,
    AutoModelForPreTraining,
    AutoModelForQuestionAnswering,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from folnet.hf.config import FolnetConfig
from folnet.hf.modeling import (
    FolnetForMaskedLM,
    FolnetForMultipleChoice,
    FolnetForPreTraining,
    FolnetForQuestionAnswering,
    FolnetForSequenceClassification,
    FolnetForTokenClassification,
    FolnetModel,
    FolnetModelOutput,
    FolnetPreTrainedModel,
)
from folnet.hf.text import FolnetForCausalLM, FolnetForConditionalGeneration

AutoConfig.register("folnet", FolnetConfig, exist_ok=True)
for _auto, _cls in ((AutoModel, FolnetModel), (AutoModelForPreTraining, FolnetForPreTraining),
                    (AutoModelForMaskedLM, FolnetForMaskedLM),
                    (AutoModelForSequenceClassification, FolnetForSequenceClassification),
                    (AutoModelForMultipleChoice, FolnetForMultipleChoice),
                    (AutoModelForQuestionAnswering, FolnetForQuestionAnswering),
                    (AutoModelForTokenClassification, FolnetForTokenClassification),
                    (AutoModelForCausalLM, FolnetForCausalLM),
                    (AutoModelForSeq2SeqLM, FolnetForConditionalGeneration)):
    _auto.register(FolnetConfig, _cls, exist_ok=True)

__all__ = ["FolnetConfig", "FolnetForCausalLM", "FolnetForConditionalGeneration",
           "FolnetForMaskedLM", "FolnetForMultipleChoice", "FolnetForPreTraining",
           "FolnetForQuestionAnswering", "FolnetForSequenceClassification",
           "FolnetForTokenClassification", "FolnetModel", "FolnetModelOutput",
           "FolnetPreTrainedModel"]
