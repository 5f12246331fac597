"""folnet in the Hugging Face stack (the ``[hf]`` extra: transformers).

Importing this module registers `FolnetConfig` (model_type "folnet") and the model classes
with the Auto classes, so ``AutoConfig``, ``AutoModel``, ``AutoModelForSequenceClassification``,
... load a directory saved by `folnet.save_pretrained` (or by these classes). The classes wrap
the native modules -- the native weight names on disk, no copy of the architecture; each head
class holds its base model under ``base_model_prefix`` (`FolnetModel`, `FolnetDecoderModel`,
`FolnetEncoderDecoderModel`).
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
)
from folnet.hf.outputs import FolnetModelOutput
from folnet.hf.pretrained import FolnetPreTrainedModel
from folnet.hf.text import FolnetForCausalLM, FolnetForConditionalGeneration
from folnet.hf.text_base import FolnetDecoderModel, FolnetEncoderDecoderModel

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

__all__ = ["FolnetConfig", "FolnetDecoderModel", "FolnetEncoderDecoderModel",
           "FolnetForCausalLM", "FolnetForConditionalGeneration",
           "FolnetForMaskedLM", "FolnetForMultipleChoice", "FolnetForPreTraining",
           "FolnetForQuestionAnswering", "FolnetForSequenceClassification",
           "FolnetForTokenClassification", "FolnetModel", "FolnetModelOutput",
           "FolnetPreTrainedModel"]
