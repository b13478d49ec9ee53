"""LLaMA-Factory's `images` and `videos` columns: its demo data converted, media paths resolved, every bad medium a
named bad row found while building (the cache key's share: test_data_media_key.py).

tests/fixtures/llamafactory-mm holds LLaMA-Factory's multimodal demo data (Apache-2.0, its LICENSE beside it); each
test works on a copy, so it may cut, replace or remove files.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from tests.support.data import write_dataset
from tuneline.data import build_dataset
from tuneline.data.loader import load_examples
from tuneline.errors import ConfigError, DataError, UserError

ALPACA_IMAGES = {"columns": {"prompt": "instruction", "response": "output", "images": "images"}}
SHAREGPT_MEDIA = {"formatting": "sharegpt", "columns": {"messages": "messages", "images": "images",
                                                       "videos": "videos"},
                  "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                           "assistant_tag": "assistant"}}
PAIRS_IMAGES = {"ranking": True, "columns": {"prompt": "instruction", "chosen": "chosen", "rejected": "rejected",
                                             "images": "images"}}


def converted(make_config, name: str, stage: str = "sft", **overrides):
    config = make_config(dataset=name, stage=stage, **overrides)
    return load_examples(config, config.dataset_names)


def good(loaded) -> list[dict]:
    assert not loaded.bad, [b.message() for b in loaded.bad]
    return loaded.per_dataset[0]


def bad_messages(loaded) -> list[str]:
    return [b.message() for b in loaded.bad]


def chat(text: str, answer: str = "ok") -> list[dict]:
    return [{"role": "user", "content": text}, {"role": "assistant", "content": answer}]


# --- LLaMA-Factory's demo data, unchanged


def test_mllm_demo_rows_carry_their_images_as_absolute_paths(media_data_dir, make_config):
    rows = good(converted(make_config, "mllm_demo"))
    images = media_data_dir / "mllm_demo_data"
    assert [ex["_images"] for ex in rows] == [[str(images / "1.jpg")] * 2, [str(images / "2.jpg")],
                                              [str(images / "3.jpg")]] * 2
    assert all(ex["_videos"] == [] for ex in rows)
    first = rows[0]
    assert first["_prompt"][0] == {"role": "user", "content": "<image>Who are they?"}
    assert first["_prompt"][2] == {"role": "user", "content": "What are they doing?<image>"}
    assert first["_response"] == [{"role": "assistant", "content": "They are celebrating on the soccer field."}]


def test_mllm_video_demo_rows_carry_their_videos(media_data_dir, make_config):
    rows = good(converted(make_config, "mllm_video_demo"))
    videos = media_data_dir / "mllm_demo_data"
    assert [ex["_videos"] for ex in rows] == [[str(videos / "1.mp4")], [str(videos / "2.avi")],
                                              [str(videos / "3.mp4")]]
    assert all(ex["_images"] == [] for ex in rows)


@pytest.mark.parametrize("stage", ["dpo", "rm"])
def test_rlhf_v_pairs_carry_their_image(media_data_dir, make_config, stage):
    rows = good(converted(make_config, "rlhf_v", stage=stage))
    assert len(rows) == 4
    first = rows[0]
    assert first["_images"] == [str(media_data_dir / "mllm_demo_data" / "1.jpg")]
    assert first["_prompt"] == [{"role": "user", "content": "<image>What is happening in this picture?"}]
    assert [answer["content"] for answer in first["_response"]] == [
        "Two football players in red kits are celebrating on the pitch.", "A family is having a picnic by a lake."]


# --- paths


def test_text_and_image_rows_mix_in_one_dataset_and_build(media_data_dir, make_config, tiny_vlm):
    one = str(media_data_dir / "mllm_demo_data" / "1.jpg")
    rows = [{"instruction": "Say hi.", "output": "hi"},
            {"instruction": "<image>What is this?", "output": "Players.", "images": "mllm_demo_data/2.jpg"},
            {"instruction": "<image>And this?", "output": "More players.", "images": [one]},
            {"instruction": "No picture here.", "output": "Right.", "images": []}]
    write_dataset(media_data_dir, "mixed", rows, ALPACA_IMAGES)
    examples = good(converted(make_config, "mixed"))
    assert [ex["_images"] for ex in examples] == [[], [str(media_data_dir / "mllm_demo_data" / "2.jpg")], [one], []]
    assert [ex["_videos"] for ex in examples] == [[]] * 4
    write_dataset(media_data_dir, "text", [{"instruction": "Add 1 and 2.", "output": "3"}])
    vision = {"model_name_or_path": str(tiny_vlm("gemma3")), "template": "gemma3"}
    ref = build_dataset(make_config(dataset="text,mixed", **vision))  # a text dataset and a media one concatenate
    assert ref["train_rows"] == 5 and ref["bad_rows"] == {}


def test_relative_paths_start_at_media_dir(media_data_dir, tmp_path, make_config):
    media = tmp_path / "media"
    (media / "pics").mkdir(parents=True)
    shutil.copy(media_data_dir / "mllm_demo_data" / "3.jpg", media / "pics" / "x.jpg")
    write_dataset(media_data_dir, "elsewhere", [{"instruction": "<image>Who?", "output": "A player.",
                                           "images": ["pics/x.jpg"]}], ALPACA_IMAGES)
    (ex,) = good(converted(make_config, "elsewhere", media_dir=str(media)))
    assert ex["_images"] == [str(media / "pics" / "x.jpg")]
    loaded = converted(make_config, "elsewhere")  # unset: relative to dataset_dir, where pics/ is not
    assert bad_messages(loaded) == [
        f"{media_data_dir / 'elsewhere.json'}: row 1, column 'images': media file missing: image "
        f"'{media_data_dir / 'pics' / 'x.jpg'}' does not exist (a relative path starts at media_dir, which defaults to "
        "dataset_dir)"]


def test_a_relative_path_found_from_the_working_directory_is_kept_as_llamafactory_keeps_it(
        media_data_dir, tmp_path, make_config, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_dataset(media_data_dir, "from_cwd", [{"instruction": "<image>Who?", "output": "A player.",
                                          "images": ["data/mllm_demo_data/1.jpg"]}], ALPACA_IMAGES)
    (ex,) = good(converted(make_config, "from_cwd"))
    assert ex["_images"] == [str(tmp_path / "data" / "mllm_demo_data" / "1.jpg")]


# --- bad media, each a named bad row


def _cut_jpeg(media_data_dir: Path) -> str:
    whole = (media_data_dir / "mllm_demo_data" / "2.jpg").read_bytes()
    (media_data_dir / "cut.jpg").write_bytes(whole[: len(whole) // 2])
    return "cut.jpg"


def _text_as_jpeg(media_data_dir: Path) -> str:
    (media_data_dir / "notes.jpg").write_text("these are notes, not a picture\n")
    return "notes.jpg"


BAD_IMAGES = {  # case -> (image file the row names (made by a function of media_data_dir), text, message after the column)
    "fewer placeholders": (lambda d: ["mllm_demo_data/1.jpg", "mllm_demo_data/2.jpg"], "<image>Who?",
                           "placeholder count: 1 <image> in the messages but 2 images; write one <image> where "
                           "each goes"),
    "no image for a placeholder": (lambda d: None, "<image>Who?",
                                   "placeholder count: 1 <image> in the messages but 0 images; write one <image> "
                                   "where each goes"),
    "missing file": (lambda d: ["mllm_demo_data/9.jpg"], "<image>Who?",
                     "media file missing: image '{data}/mllm_demo_data/9.jpg' does not exist (a relative path starts "
                     "at media_dir, which defaults to dataset_dir)"),
    "truncated jpeg": (lambda d: [_cut_jpeg(d)], "<image>Who?",
                       "bad image: '{data}/cut.jpg' does not decode (image file is truncated"),
    "text named .jpg": (lambda d: [_text_as_jpeg(d)], "<image>Who?",
                        "bad image: '{data}/notes.jpg' is not an image PIL can read"),
    "url": (lambda d: ["https://example.com/a.jpg"], "<image>Who?",
            "remote media: 'https://example.com/a.jpg' is a URL; download it and give the local path (relative to "
            "media_dir, or absolute)"),
    "not a path": (lambda d: [{"bytes": None, "path": "a.jpg"}], "<image>Who?",
                   "wrong type: each of images must be a file path, got image data stored in the dataset (e.g. a "
                   "hub Image column)"),
}


@pytest.mark.parametrize("case", sorted(BAD_IMAGES))
def test_each_bad_image_is_a_named_bad_row(media_data_dir, make_config, case):
    make_images, text, message = BAD_IMAGES[case]
    rows = [{"instruction": "<image>Fine?", "output": "Yes.", "images": "mllm_demo_data/3.jpg"},
            {"instruction": text, "output": "A player.", "images": make_images(media_data_dir)}]
    write_dataset(media_data_dir, "bad", rows, ALPACA_IMAGES)
    loaded = converted(make_config, "bad")
    assert len(loaded.per_dataset[0]) == 1
    (got,) = bad_messages(loaded)
    assert got.startswith(f"{media_data_dir / 'bad.json'}: row 2, column 'images': {message.format(data=media_data_dir)}"), got


def test_a_bad_image_stops_the_build_before_tokenizing_or_is_skipped(media_data_dir, make_config, tiny_vlm):
    rows = [{"instruction": "<image>Fine?", "output": "Yes.", "images": "mllm_demo_data/3.jpg"},
            {"instruction": "<image>Who?", "output": "A player.", "images": [_cut_jpeg(media_data_dir)]}]
    write_dataset(media_data_dir, "bad", rows, ALPACA_IMAGES)
    vision = {"model_name_or_path": str(tiny_vlm("gemma3")), "template": "gemma3"}
    with pytest.raises(DataError, match=r"bad\.json: row 2, column 'images': bad image: .*cut\.jpg' does not decode"):
        build_dataset(make_config(dataset="bad", **vision))
    ref = build_dataset(make_config(dataset="bad", on_bad_rows="skip", **vision))
    assert (ref["train_rows"], ref["bad_rows"]) == (1, {"bad image": 1})


def _cut(media_data_dir: Path, video: str, keep: float) -> str:
    whole = (media_data_dir / "mllm_demo_data" / video).read_bytes()
    (media_data_dir / f"cut_{video}").write_bytes(whole[: int(len(whole) * keep)])
    return f"cut_{video}"


def _cut_at_a_packet(media_data_dir: Path) -> str:
    """3.mp4 (146 frames) with its index moved to the front, cut where its 61st frame's packet starts: it opens,
    its header still says 146 frames, and it decodes 60 without an error."""
    import av

    whole = media_data_dir / "front_index.mp4"
    with av.open(str(media_data_dir / "mllm_demo_data" / "3.mp4")) as source, \
            av.open(str(whole), "w", options={"movflags": "faststart"}) as out:
        stream = out.add_stream_from_template(source.streams.video[0])
        for packet in source.demux(source.streams.video[0]):
            if packet.dts is not None:
                packet.stream = stream
                out.mux(packet)
    with av.open(str(whole)) as remuxed:
        starts = [packet.pos for packet in remuxed.demux(remuxed.streams.video[0]) if packet.size]
    (media_data_dir / "short.mp4").write_bytes(whole.read_bytes()[: starts[60]])
    return "short.mp4"


def _audio_only(media_data_dir: Path) -> str:
    import av
    import numpy as np

    with av.open(str(media_data_dir / "tone.mp4"), "w") as out:
        stream = out.add_stream("aac", rate=8000, layout="mono")
        samples = (np.sin(np.arange(8000) / 5) * 0.3).astype(np.float32)[None, :]
        frame = av.AudioFrame.from_ndarray(samples, format="fltp", layout="mono")
        frame.sample_rate = 8000
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return "tone.mp4"


def _empty(media_data_dir: Path) -> str:
    (media_data_dir / "empty.mp4").write_bytes(b"")
    return "empty.mp4"


def _text_as_mp4(media_data_dir: Path) -> str:
    (media_data_dir / "notes.mp4").write_text("these are notes, not a video\n")
    return "notes.mp4"


NOT_OPENING = "does not open as a video (Invalid data found when processing input); is it cut short, or not a video?"
BAD_VIDEOS = {  # case -> (videos the row names (made by a function of media_data_dir), text, message after the column)
    "missing file": (lambda d: ["mllm_demo_data/9.mp4"], "<video>What happens?",
                     "media file missing: video '{data}/mllm_demo_data/9.mp4' does not exist (a relative path starts "
                     "at media_dir, which defaults to dataset_dir)"),
    "mp4 cut in half": (lambda d: [_cut(d, "1.mp4", 0.5)], "<video>What happens?",
                        f"bad video: '{{data}}/cut_1.mp4' {NOT_OPENING}"),
    "mp4 cut at a packet": (lambda d: [_cut_at_a_packet(d)], "<video>What happens?",
                            "bad video: '{data}/short.mp4' decodes 60 frames but its header says 146 (is it cut "
                            "short?)"),
    "avi cut in half": (lambda d: [_cut(d, "2.avi", 0.5)], "<video>What happens?",
                        "bad video: '{data}/cut_2.avi' stops decoding after 137 of 270 frames (Invalid data found "
                        "when processing input)"),
    "text named .mp4": (lambda d: [_text_as_mp4(d)], "<video>What happens?",
                        f"bad video: '{{data}}/notes.mp4' {NOT_OPENING}"),
    "sound only": (lambda d: [_audio_only(d)], "<video>What happens?",
                   "bad video: '{data}/tone.mp4' holds no video stream (only audio)"),
    "empty file": (lambda d: [_empty(d)], "<video>What happens?", "bad video: '{data}/empty.mp4' is empty"),
    "no placeholder": (lambda d: ["mllm_demo_data/3.mp4"], "What happens?",
                       "placeholder count: 0 <video> in the messages but 1 video; write one <video> where each goes"),
    "one placeholder too many": (lambda d: ["mllm_demo_data/3.mp4"], "<video>What happens?<video>",
                                 "placeholder count: 2 <video> in the messages but 1 video; write one <video> where "
                                 "each goes"),
    "frames for a video": (lambda d: [["f1.jpg", "f2.jpg"]], "<video>What happens?",
                           "wrong type: a video given as a list of frame images is not supported; give the video "
                           "file's path"),
}


@pytest.mark.parametrize("case", sorted(BAD_VIDEOS))
def test_each_bad_video_is_a_named_bad_row(media_data_dir, make_config, case):
    make_videos, text, message = BAD_VIDEOS[case]
    rows = [{"messages": chat("<video>Fine?"), "videos": ["mllm_demo_data/1.mp4"]},
            {"messages": chat(text), "videos": make_videos(media_data_dir)}]
    write_dataset(media_data_dir, "clips", rows, SHAREGPT_MEDIA)
    loaded = converted(make_config, "clips")
    assert [ex["_videos"] for ex in loaded.per_dataset[0]] == [[str(media_data_dir / "mllm_demo_data" / "1.mp4")]]
    assert bad_messages(loaded) == [
        f"{media_data_dir / 'clips.json'}: row 2, column 'videos': {message.format(data=media_data_dir)}"]


def test_a_bad_video_stops_the_build_before_tokenizing(media_data_dir, make_config):
    rows = json.loads((media_data_dir / "mllm_video_demo.json").read_text())
    rows[1]["videos"] = [_cut(media_data_dir, "2.avi", 0.5)]
    (media_data_dir / "mllm_video_demo.json").write_text(json.dumps(rows))
    with pytest.raises(DataError, match=r"mllm_video_demo\.json: row 2, column 'videos': bad video: .*cut_2\.avi' "
                                        r"stops decoding after 137 of 270 frames"):
        build_dataset(make_config(dataset="mllm_video_demo"))


def test_videos_without_pyav_are_refused_with_what_to_install(media_data_dir, make_config, monkeypatch):
    """PyAV is an extra (`tuneline[video]`): where it is not installed, a video dataset stops with one message.
    (`sys.modules["av"] = None` makes `import av` fail as it does where the package is missing.)"""
    monkeypatch.setitem(sys.modules, "av", None)
    with pytest.raises(UserError, match=r"reading videos needs PyAV, which is not installed: `pip install "
                                        r"'tuneline\[video\]'`"):
        converted(make_config, "mllm_video_demo")
    assert good(converted(make_config, "mllm_demo"))  # images alone do not need it


def test_placeholders_in_the_answers_count_and_each_pair_is_checked(media_data_dir, make_config):
    rows = [{"messages": chat("<image>Who?", "Kane <image>"), "images": ["mllm_demo_data/1.jpg"] * 2},
            {"messages": chat("<image>Who?", "Kane <image>"), "images": ["mllm_demo_data/1.jpg"]}]
    write_dataset(media_data_dir, "answers", rows, SHAREGPT_MEDIA)
    loaded = converted(make_config, "answers")
    assert bad_messages(loaded) == [
        f"{media_data_dir / 'answers.json'}: row 2, column 'images': placeholder count: 2 <image> in the messages but 1 "
        "image; write one <image> where each goes"]
    pairs = [{"instruction": "<image>Who?", "chosen": "Kane", "rejected": "Muller", "images": "mllm_demo_data/1.jpg"},
             {"instruction": "<image>Who?", "chosen": "Kane", "rejected": "<image> Muller",
              "images": "mllm_demo_data/1.jpg"}]
    write_dataset(media_data_dir, "pairs", pairs, PAIRS_IMAGES)
    loaded = converted(make_config, "pairs", stage="dpo")
    assert bad_messages(loaded) == [
        f"{media_data_dir / 'pairs.json'}: row 2, column 'images': placeholder count: 2 <image> in the messages but 1 "
        "image; write one <image> where each goes"]


def test_a_text_dataset_is_not_checked_for_placeholders(media_data_dir, make_config):
    """As in LLaMA-Factory, where a text model's plugin counts nothing: `<image>` in text is only text."""
    write_dataset(media_data_dir, "html", [{"instruction": "Escape <image> in HTML.", "output": "&lt;image&gt;"}])
    (ex,) = good(converted(make_config, "html"))
    assert (ex["_images"], ex["_videos"]) == ([], [])


# --- entries refused


@pytest.mark.parametrize("preset", ["llava", "gemma3"])
def test_videos_on_a_model_that_reads_images_only_are_refused_before_encoding(media_data_dir, make_config, tiny_vlm,
                                                                              preset):
    """LLaMA-Factory's llava and gemma3 plugins have no video token: refused once, before any row is encoded (and
    before torchvision, which would not help), naming the templates that read videos."""
    config = make_config(dataset="mllm_video_demo", model_name_or_path=str(tiny_vlm(preset)), template=preset)
    with pytest.raises(ConfigError, match=f"the dataset holds videos, but 'template: {preset}' \\(multimodal plugin "
                                          f"'{preset}', as in LLaMA-Factory\\) reads images only; use a template whose "
                                          "model reads videos \\(intern_s1, intern_vl, qwen2_vl, qwen3_vl, "
                                          "qwen3_vl_nothink\\), or leave the "
                                          "videos out"):
        build_dataset(config)


def test_tuneline_validate_refuses_a_video_dataset_for_a_template_without_videos(media_data_dir, tiny_vlm, tmp_path,
                                                                                 capsys, monkeypatch):
    """Said before anything starts, from dataset_info.json alone: the build would decode every video first."""
    from cli.main import run

    config = tmp_path / "video.yaml"
    for template, code in (("llava", 2), ("gemma3", 2), ("qwen2_vl", None), ("intern_vl", 0)):
        config.write_text(f"model_name_or_path: {tiny_vlm('llava')}\ndataset: mllm_demo,mllm_video_demo\n"
                          f"dataset_dir: {media_data_dir}\ntemplate: {template}\noutput_dir: {tmp_path / 'out'}\n")
        done, err = run(["validate", str(config)]), capsys.readouterr().err
        problem = "dataset 'mllm_video_demo' has a 'videos' column, but 'template: "
        if code:
            assert done == code and "Traceback" not in err
            assert (f"{problem}{template}' reads no videos (LLaMA-Factory's plugin for it has no video token either); "
                    "use a template whose model reads videos (intern_s1, intern_vl, qwen2_vl, qwen3_vl, qwen3_vl_nothink), "
                    "or remove 'videos' "
                    "from the entry's columns in dataset_info.json") in err, err
            assert "'mllm_demo'" not in err, "an entry without videos is fine"
        else:  # reads videos (where torchvision does not load, refused for that instead: not InternVL, whose frames
            assert problem not in err and "PyAV" not in err  # go through its image processor)
            assert code is None or (done == 0 and "torchvision" not in err), err
    monkeypatch.setitem(sys.modules, "av", None)  # `import av` fails, as where PyAV is not installed
    without_av = tmp_path / "video-without-av.yaml"  # a new file: checks are memoised per file content
    without_av.write_text(config.read_text())
    assert run(["validate", str(without_av)]) == 2
    assert "reading videos needs PyAV, which is not installed: `pip install 'tuneline[video]'`" in capsys.readouterr().err


def test_audio_and_hub_media_are_refused_with_what_to_do(media_data_dir, make_config):
    info = json.loads((media_data_dir / "dataset_info.json").read_text())
    info["voice"] = {"file_name": "mllm_demo.json", "formatting": "sharegpt",
                     "columns": {"messages": "messages", "audios": "audios"}}
    info["hub_pics"] = {"hf_hub_url": "llamafactory/RLHF-V", "ranking": True, "formatting": "sharegpt",
                        "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected",
                                    "images": "images"}}
    (media_data_dir / "dataset_info.json").write_text(json.dumps(info))
    with pytest.raises(DataError, match="dataset 'voice': columns key 'audios': audio is not supported; remove the "
                                        "column and its <audio> placeholders"):
        converted(make_config, "voice")
    with pytest.raises(DataError, match=r"dataset 'hub_pics': images and videos of a hub dataset \('hf_hub_url: "
                                        r"llamafactory/RLHF-V'\) are not read from the hub; put its rows .* in the "
                                        f"folder '{media_data_dir / 'llamafactory' / 'RLHF-V'}'"):
        converted(make_config, "hub_pics", stage="dpo")


def test_a_hub_entry_with_images_reads_its_local_copy_in_dataset_dir(media_data_dir, make_config):
    """LLaMA-Factory's own `rlhf_v` entry names the hub dataset: its rows in dataset_dir/<hub id> are read as files,
    each bad row named by its file."""
    info = json.loads((media_data_dir / "dataset_info.json").read_text())
    info["rlhf_v"] = {"hf_hub_url": "llamafactory/RLHF-V", **{k: v for k, v in info["rlhf_v"].items()
                                                               if k != "file_name"}}
    (media_data_dir / "dataset_info.json").write_text(json.dumps(info))
    local = media_data_dir / "llamafactory" / "RLHF-V"
    local.mkdir(parents=True)
    rows = json.loads((media_data_dir / "rlhf_v_demo.json").read_text())
    rows[1]["images"] = ["mllm_demo_data/missing.jpg"]
    (local / "train.json").write_text(json.dumps(rows))
    loaded = converted(make_config, "rlhf_v", stage="dpo")
    assert [ex["_images"] for ex in loaded.per_dataset[0]][0] == [str(media_data_dir / "mllm_demo_data" / "1.jpg")]
    assert len(loaded.per_dataset[0]) == 3
    assert bad_messages(loaded) == [f"{local / 'train.json'}: row 2, column 'images': media file missing: image "
                                    f"'{media_data_dir / 'mllm_demo_data' / 'missing.jpg'}' does not exist (a relative "
                                    "path starts at media_dir, which defaults to dataset_dir)"]


def test_media_dir_is_a_data_key(media_data_dir, make_config, tmp_path):
    assert make_config(dataset="mllm_demo", media_dir=str(tmp_path)).data.media_dir == str(tmp_path)
    with pytest.raises(ConfigError, match="'media_dir'"):
        make_config(dataset="mllm_demo", media_dir=["a", "b"])
