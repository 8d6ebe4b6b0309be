"""Models nobody here wrote: Hugging Face transformers' implementations, built from small configs with
random weights (nothing is downloaded), each with a batch and a training step the way their users
write one.  The shapes are cut down (few layers, small images) so a step takes tens of milliseconds on
two cores; the architectures, and so the op mix the findings judge, are the real ones."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import pytest
import torch

transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)


@dataclass
class Workload:
    name: str
    model: torch.nn.Module
    batch: dict             # the model's keyword inputs, labels included
    kind: str               # "vision" or "text"

    def loss(self) -> torch.Tensor:
        return self.model(**self.batch).loss


def _images(batch: int, size: int, labels: int) -> dict:
    return {"pixel_values": torch.randn(batch, 3, size, size), "labels": torch.randint(0, labels, (batch,))}


def gpt2() -> Workload:
    config = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=2048, n_positions=64,
                                     bos_token_id=0, eos_token_id=0)
    ids = torch.randint(0, 2048, (4, 64))
    return Workload("gpt2", transformers.GPT2LMHeadModel(config), {"input_ids": ids, "labels": ids}, "text")


def bert() -> Workload:
    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=128, num_attention_heads=4,
                                     intermediate_size=512, vocab_size=2048, max_position_embeddings=64,
                                     num_labels=3)
    batch = {"input_ids": torch.randint(0, 2048, (8, 64)), "labels": torch.randint(0, 3, (8,))}
    return Workload("bert", transformers.BertForSequenceClassification(config), batch, "text")


def vit() -> Workload:
    config = transformers.ViTConfig(image_size=64, patch_size=8, num_hidden_layers=2, hidden_size=128,
                                    num_attention_heads=4, intermediate_size=512, num_labels=10)
    return Workload("vit", transformers.ViTForImageClassification(config), _images(8, 64, 10), "vision")


def convnext() -> Workload:
    config = transformers.ConvNextConfig(depths=[1, 1, 2, 1], hidden_sizes=[32, 64, 128, 256], num_labels=10,
                                         image_size=64)
    return Workload("convnext", transformers.ConvNextForImageClassification(config), _images(8, 64, 10), "vision")


def resnet18() -> Workload:
    # torchvision's resnet18 block structure: basic blocks, [2, 2, 2, 2], 64-512 channels
    config = transformers.ResNetConfig(layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512],
                                       num_labels=10)
    return Workload("resnet18", transformers.ResNetForImageClassification(config), _images(8, 64, 10), "vision")


def mobilenet_v2() -> Workload:
    config = transformers.MobileNetV2Config(image_size=64, depth_multiplier=0.5, num_labels=10)
    return Workload("mobilenet_v2", transformers.MobileNetV2ForImageClassification(config), _images(8, 64, 10),
                    "vision")


BUILDERS: dict[str, Callable[[], Workload]] = {
    "gpt2": gpt2, "bert": bert, "vit": vit, "convnext": convnext, "resnet18": resnet18, "mobilenet_v2": mobilenet_v2,
}


def build(name: str, seed: int = 0) -> Workload:
    torch.manual_seed(seed)
    return BUILDERS[name]()
