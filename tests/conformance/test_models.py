"""transformers' common model and configuration tests (``ModelTesterMixin``,
``ConfigTester``) for BERT and GPT-2 -- the controls -- and for folnet's HF classes: the seven
encoder classes, the causal LM and the encoder-decoder. Run by `tests/conformance/run.py`."""

from __future__ import annotations

import unittest

import torch
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    GPT2Config,
    GPT2LMHeadModel,
)
from transformers.models.auto import modeling_auto
from transformers.testing_utils import torch_device

import folnet.hf as fh

from ..generation.test_utils import GenerationTesterMixin
from ..test_configuration_common import ConfigTester
from ..test_modeling_common import ModelTesterMixin
from .testers import BertTester, FolnetTester, Gpt2Tester


class _Labels:
    """Labels for the pretraining heads, as BERT's own test class adds them."""

    pretraining: tuple = ()

    def _prepare_for_class(self, inputs_dict, model_class, return_labels=False):
        inputs = super()._prepare_for_class(inputs_dict, model_class, return_labels)
        if return_labels and model_class in self.pretraining:
            t = self.model_tester
            inputs["labels"] = torch.zeros((t.batch_size, t.seq_length), dtype=torch.long,
                                           device=torch_device)
            inputs["next_sentence_label"] = torch.zeros(t.batch_size, dtype=torch.long,
                                                        device=torch_device)
        return inputs


class BertModelTest(_Labels, ModelTesterMixin, unittest.TestCase):
    all_model_classes = (BertModel, BertForMaskedLM, BertForPreTraining,
                         BertForSequenceClassification, BertForMultipleChoice,
                         BertForQuestionAnswering, BertForTokenClassification)
    pretraining = (BertForPreTraining,)

    def setUp(self):
        self.model_tester = BertTester(self)
        self.config_tester = ConfigTester(self, config_class=BertConfig, hidden_size=37)

    def test_config(self):
        self.config_tester.run_common_tests()


class Gpt2ModelTest(ModelTesterMixin, GenerationTesterMixin, unittest.TestCase):
    all_model_classes = (GPT2LMHeadModel,)

    def setUp(self):
        self.model_tester = Gpt2Tester(self)
        self.config_tester = ConfigTester(self, config_class=GPT2Config, n_embd=37)

    def test_config(self):
        self.config_tester.run_common_tests()


#: transformers' name tables list every model in its tree; folnet's classes are registered with
#: the Auto classes at run time instead, so they are added here, as an in-tree model's would
#: be: ``_prepare_for_class`` makes each head's labels, and the base model skips training.
NAME_TABLES = {
    "MODEL_MAPPING_NAMES": "FolnetModel",
    "MODEL_FOR_PRETRAINING_MAPPING_NAMES": "FolnetForPreTraining",
    "MODEL_FOR_MASKED_LM_MAPPING_NAMES": "FolnetForMaskedLM",
    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES": "FolnetForSequenceClassification",
    "MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES": "FolnetForMultipleChoice",
    "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES": "FolnetForQuestionAnswering",
    "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES": "FolnetForTokenClassification",
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES": "FolnetForCausalLM",
    "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES": "FolnetForConditionalGeneration",
}
for _table, _name in NAME_TABLES.items():
    getattr(modeling_auto, _table)["folnet"] = _name


class _Folnet:
    #: The last layer's binary-stream update is read by nothing when the head reads the
    #: unary stream (run_stack skips it), so its out_b weights get no gradient -- with or
    #: without checkpointing. The knob transformers gives such models; the test still
    #: compares which parameters get gradients with and without checkpointing.
    test_all_params_have_gradient = False


class FolnetModelTest(_Folnet, _Labels, ModelTesterMixin, unittest.TestCase):
    all_model_classes = (fh.FolnetModel, fh.FolnetForMaskedLM, fh.FolnetForPreTraining,
                         fh.FolnetForSequenceClassification, fh.FolnetForMultipleChoice,
                         fh.FolnetForQuestionAnswering, fh.FolnetForTokenClassification)
    pretraining = (fh.FolnetForPreTraining,)

    def setUp(self):
        self.model_tester = FolnetTester(self)
        self.config_tester = ConfigTester(self, config_class=fh.FolnetConfig, hidden_size=37)

    def test_config(self):
        self.config_tester.run_common_tests()


class FolnetCausalLMTest(_Folnet, _Labels, ModelTesterMixin, GenerationTesterMixin,
                         unittest.TestCase):
    all_model_classes = (fh.FolnetForCausalLM,)

    def setUp(self):
        self.model_tester = FolnetTester(self, kind="decoder")
        self.config_tester = ConfigTester(self, config_class=fh.FolnetConfig, kind="decoder",
                                          hidden_size=37)

    def test_config(self):
        self.config_tester.run_common_tests()


class FolnetSeq2SeqTest(_Folnet, _Labels, ModelTesterMixin, GenerationTesterMixin,
                        unittest.TestCase):
    all_model_classes = (fh.FolnetForConditionalGeneration,)
    is_encoder_decoder = True

    def setUp(self):
        self.model_tester = FolnetTester(self, kind="encoder-decoder")
        self.config_tester = ConfigTester(self, config_class=fh.FolnetConfig,
                                          kind="encoder-decoder", hidden_size=37)

    def test_config(self):
        self.config_tester.run_common_tests()
