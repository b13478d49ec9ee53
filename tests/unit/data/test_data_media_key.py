"""The images and videos a dataset names are part of its cache key, by content: an edited image rebuilds, unchanged
files keep the key, and a text dataset's key never looks at media."""

from __future__ import annotations

import json
import os
import shutil

from tests.support.data import write_dataset
from tuneline.data import dataset_fingerprint


def test_the_media_contents_are_part_of_the_cache_key(media_data_dir, tmp_path, make_config):
    config = make_config(dataset="mllm_demo")
    key = dataset_fingerprint(config)
    assert dataset_fingerprint(config) == key  # unchanged files: the same key
    image = media_data_dir / "mllm_demo_data" / "2.jpg"
    memo = json.loads((tmp_path / "cache" / "file-hashes" / "file_hashes.json").read_text())
    assert str(image.resolve()) in memo  # remembered by path, size and mtime, as the data files are
    os.utime(image, ns=(1, 1))  # touched, same bytes: hashed again, the same key
    assert dataset_fingerprint(config) == key
    image.write_bytes((media_data_dir / "mllm_demo_data" / "3.jpg").read_bytes())  # an image edited in place
    edited = dataset_fingerprint(config)
    assert edited != key
    assert dataset_fingerprint(config) == edited
    video_key = dataset_fingerprint(make_config(dataset="mllm_video_demo"))
    with open(media_data_dir / "mllm_demo_data" / "2.avi", "ab") as handle:
        handle.write(b"\0")
    assert dataset_fingerprint(make_config(dataset="mllm_video_demo")) != video_key


def test_rows_naming_other_media_or_another_media_dir_change_the_key(media_data_dir, tmp_path, make_config):
    key = dataset_fingerprint(make_config(dataset="rlhf_v", stage="dpo"))
    rows = json.loads((media_data_dir / "rlhf_v_demo.json").read_text())
    rows[0]["images"] = ["mllm_demo_data/3.jpg"]
    (media_data_dir / "rlhf_v_demo.json").write_text(json.dumps(rows))
    renamed = dataset_fingerprint(make_config(dataset="rlhf_v", stage="dpo"))
    assert renamed != key
    shutil.copytree(media_data_dir / "mllm_demo_data", tmp_path / "media" / "mllm_demo_data")
    (tmp_path / "media" / "mllm_demo_data" / "1.jpg").write_bytes(b"not the same picture")
    assert dataset_fingerprint(make_config(dataset="rlhf_v", stage="dpo", media_dir=str(tmp_path / "media"))) != renamed


def test_a_text_dataset_key_does_not_read_media(media_data_dir, make_config):
    write_dataset(media_data_dir, "text", [{"instruction": "Add 1 and 2.", "output": "3"}])
    config = make_config(dataset="text")
    key = dataset_fingerprint(config)
    shutil.rmtree(media_data_dir / "mllm_demo_data")
    assert dataset_fingerprint(make_config(dataset="text", media_dir="elsewhere")) == key
