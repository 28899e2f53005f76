"""SFT's input checks."""

import pytest

from aha.config import SFTConfig
from aha.train.sft import SFTTrainer


@pytest.mark.parametrize("row, message", [
    ({"prompt": "1+1=", "completion": None}, r"SFT row 1: the completion \('completion'.*got None"),
    ({"prompt": "1+1=", "completion": 2}, r"SFT row 1: the completion \('completion'.*got 2"),
    ({"prompt": None, "completion": "2"}, r"SFT row 1: the prompt \('prompt'\).*got None"),
    ({"prompt": "", "completion": "2"}, r"SFT row 1: the prompt \('prompt'\).*got ''"),
])
def test_a_row_without_text_is_named(tiny_dir, tmp_path, row, message):
    rows = [{"prompt": "2+2=", "completion": "4"}, row]
    with pytest.raises(ValueError, match=message):
        SFTTrainer(model=tiny_dir, train_dataset=rows, args=SFTConfig(output_dir=str(tmp_path), report_to=["none"]))
