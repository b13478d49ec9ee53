"""model_fingerprint: keyed by weight and adapter content and the keys that shape the model, without torch."""

from __future__ import annotations

import shutil
import subprocess
import sys

from tests.support.model_steps import make_adapter
from tuneline.model import model_fingerprint
from tuneline.model.fingerprint import reward_model_fingerprint


def test_content_and_keys_decide_the_fingerprint(make_config, tiny_model_dir, tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(tiny_model_dir, copy)
    config = make_config(model_name_or_path=str(copy))
    first = model_fingerprint(config, tmp_path / "memo")
    assert model_fingerprint(config, tmp_path / "memo") == first
    assert model_fingerprint(make_config(model_name_or_path=str(tiny_model_dir)), tmp_path / "memo") == first
    assert model_fingerprint(make_config(model_name_or_path=str(copy), lora_rank=16)) != first
    assert model_fingerprint(make_config(model_name_or_path=str(copy), lora_rank=16),
                             include_finetuning=False) == model_fingerprint(config, include_finetuning=False)
    (copy / "README.md").write_text("notes do not change the weights")
    assert model_fingerprint(config, tmp_path / "memo") == first
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert model_fingerprint(config, tmp_path / "memo") != first


def test_adapters_count_by_content(make_config, tiny_model_dir, tmp_path):
    adapter = make_adapter(tiny_model_dir, tmp_path / "adapter", seed=1)
    config = make_config(adapter_name_or_path=str(adapter))
    with_adapter = model_fingerprint(config)
    assert with_adapter != model_fingerprint(make_config())
    assert model_fingerprint(make_config(), adapters=str(adapter)) == with_adapter
    make_adapter(tiny_model_dir, adapter, seed=2)  # retrained in place
    assert model_fingerprint(config) != with_adapter


def test_ppo_train_key_follows_the_reward_model_content(make_config, tiny_model_dir, tmp_path):
    from tuneline.identity.keys import train_key

    reward = make_adapter(tiny_model_dir, tmp_path / "rm", seed=1)
    config = make_config(stage="ppo", reward_model=str(reward), pipeline_cache_dir=str(tmp_path / "cache"))
    key = train_key(config, "data", "ref")
    assert reward_model_fingerprint(make_config()) is None  # other stages have no reward model
    make_adapter(tiny_model_dir, reward, seed=2)  # the reward model trained again into the same folder
    assert train_key(config, "data", "ref") != key


def test_fingerprinting_does_not_import_torch(tiny_model_dir):
    code = ("import sys; from tuneline.config import load_config; from tuneline.model import model_fingerprint; "
            f"model_fingerprint(load_config(None, {{'model_name_or_path': '{tiny_model_dir}', 'dataset': 'x'}}, "
            "check_paths=False)); assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
