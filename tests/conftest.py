"""Shared fixtures: a tiny model directory built in code (no download), once per session."""

import os
import tempfile

import pytest
import torch

torch.set_num_threads(2)
os.environ["HF_HUB_OFFLINE"] = "1"  # tests never reach the Hub: an uncached hub id is an offline error
os.environ["WANDB_MODE"] = "offline"  # trackers write local files only
os.environ["WANDB_SILENT"] = "true"
os.environ["TRACKIO_DIR"] = tempfile.mkdtemp(prefix="aha-trackio-")  # read by trackio when it is imported


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    from aha.models.tiny import make_tiny
    from aha.tasks import task_corpus
    from aha.tasks.arithmetic import make_addition
    texts = task_corpus(make_addition("train", 300, seed=0)) + ["count the letters: aaa bbb"]
    return str(make_tiny(tmp_path_factory.mktemp("tiny") / "model", texts, size="tiny", seed=0))
