"""Loading models and tokenizers: errors that name what is wrong."""

import pytest


def test_a_model_dir_without_a_tokenizer_and_a_bad_attention_name_say_so(tiny_dir, tmp_path):
    import shutil
    from aha.models.load import load_model, load_tokenizer
    bare = tmp_path / "bare"
    shutil.copytree(tiny_dir, bare)
    for f in bare.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges", "chat_template")):
            f.unlink()
    with pytest.raises(ValueError, match=rf"^no tokenizer in {bare}: it has none of tokenizer.json"):
        load_tokenizer(str(bare))
    with pytest.raises(ValueError, match=rf"^cannot load model from {tiny_dir}: .*attn_implementation"):
        load_model(str(tiny_dir), attn_implementation="bogus")
