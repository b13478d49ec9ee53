"""The `tuneline` command.

    tuneline train examples/sft_lora_demo.yaml learning_rate=5e-5 max_steps=20 [--no-cache]
    tuneline predict CONFIG [key=value ...] [--no-cache]   (do_predict: answers to eval_dataset, no training)
    tuneline validate CONFIG [key=value ...]      tuneline preview CONFIG [key=value ...]
    tuneline tiny-model OUT_DIR [--preset demo|gemma3|llava|qwen2_vl|...]   tuneline export CONFIG [...]
    tuneline chat CONFIG [key=value ...] [--prompt TEXT] [--tools TOOLS_JSON] [--image PATH ...]
    tuneline api CONFIG|models:/NAME@ALIAS|EXPORT_DIR [key=value ...]   (OpenAI-compatible; API_HOST, API_PORT, API_KEY)
    tuneline retrain CONFIG REGISTERED_MODEL [key=value ...] [--force] [--metric eval_loss] [--min-delta 0]
    tuneline sweep CONFIG [key=value ...] --grid learning_rate=1e-4,5e-5 pref_beta=0.1,0.3 [--max-parallel 2]
    tuneline serve [PREFECT_YAML]                 (every deployment of deployments/prefect.yaml, one process)
    tuneline trigger DEPLOYMENT [key=value ...]   (start a run of a deployment; prints its id and UI page)
    tuneline ui [--prefect-port 4200] [--mlflow-port 5000]   (both servers on 127.0.0.1; Ctrl+C stops both)
    tuneline train-node CONFIG [key=value ...] --machine-rank N   (another machine joins the main one's training)

It lives in flows/ because `train` starts a Prefect flow and the library below never imports Prefect.
`train` is flows.finetune's own command line (`main`), looked up only when chosen. Heavy imports (prefect, torch,
transformers) wait until the chosen command needs them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable

from tuneline.config import load_config
from tuneline.errors import UserError, report_user_errors
from tuneline.pipeline.preflight import checked_config


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tuneline", description="LLM fine-tuning as cached Prefect flows")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in [("train", "run the fine-tuning flow"),
                            ("predict", "answer the eval set with the config's model, scored as LLaMA-Factory does "
                                        "(do_predict), training nothing"),
                            ("validate", "check a config and exit"),
                            ("preview", "show encoded examples with prompt and label spans"),
                            ("export", "merge LoRA adapters and save a standalone model"),
                            ("chat", "talk to the trained model through its template")]:
        cmd = sub.add_parser(name, help=help_text)
        cmd.add_argument("config", help="YAML config (LLaMA-Factory keys plus tuneline's)")
        cmd.add_argument("overrides", nargs="*", help="key=value, typed as in YAML")
        if name in ("train", "predict"):
            cmd.add_argument("--no-cache", action="store_true", help="rerun every step (refresh_cache=true)")
        if name == "chat":
            cmd.add_argument("--prompt", help="answer this one message and exit (default: a conversation on stdin)")
            cmd.add_argument("--tools", metavar="FILE", help="a JSON file holding the tool list the model may call; "
                                                             "its calls are shown, their result is read at "
                                                             "'Observation: '")
            cmd.add_argument("--image", action="append", default=[], metavar="PATH",
                             help="an image for a vision-language model, shown with --prompt or the first message "
                                  "(at its <image> placeholders, else before its text); repeat for more; in the "
                                  "conversation, '/image PATH' attaches one to the next message")
        if name == "preview":
            cmd.add_argument("-n", type=int, default=2, help="examples to show")
    api = sub.add_parser("api", help="serve the trained model to OpenAI clients (/v1/chat/completions)")
    api.add_argument("target", help="a training config, models:/NAME@ALIAS, or a `tuneline export` folder")
    api.add_argument("overrides", nargs="*", help="key=value, typed as in YAML (infer_backend, vllm_*, any key)")
    retrain = sub.add_parser("retrain", help="train on new data only, promote only a better model")
    retrain.add_argument("config")
    retrain.add_argument("registered_model", help="the MLflow registered model whose 'champion' alias is managed")
    retrain.add_argument("overrides", nargs="*", help="key=value, typed as in YAML")
    retrain.add_argument("--force", action="store_true", help="train even when the data is unchanged")
    retrain.add_argument("--metric", default="eval_loss", help="the evaluation metric that decides")
    retrain.add_argument("--greater-is-better", action="store_true", help="higher --metric wins (default: lower)")
    retrain.add_argument("--min-delta", type=float, default=0.0, help="the gain needed to replace the champion")
    _add_sweep_parser(sub)
    serve = sub.add_parser("serve", help="serve every deployment of a prefect.yaml from this process")
    serve.add_argument("prefect_yaml", nargs="?", default="deployments/prefect.yaml")
    trigger = sub.add_parser("trigger", help="start a run of a deployment on the Prefect server")
    trigger.add_argument("deployment", help="DEPLOYMENT or FLOW/DEPLOYMENT, e.g. sft-nightly")
    trigger.add_argument("assignments", nargs="*",
                         help="key=value: config_path, a field of the Run form, or any config key (an override)")
    ui = sub.add_parser("ui", help="start the Prefect and MLflow servers on 127.0.0.1 until Ctrl+C")
    ui.add_argument("--host", default="127.0.0.1", help="address to bind both servers to")
    ui.add_argument("--prefect-port", type=int, default=4200)
    ui.add_argument("--mlflow-port", type=int, default=5000)
    node = sub.add_parser("train-node", help="on a machine other than the main one: join its training")
    node.add_argument("config", help="the config the main machine's `tuneline train` runs")
    node.add_argument("overrides", nargs="*", help="key=value, the same as the main machine's")
    node.add_argument("--machine-rank", type=int, help="this machine's rank, 1 to num_machines - 1 (sets machine_rank)")
    node.add_argument("--wait", type=float, default=3600.0, help="seconds to wait for the main machine's dataset")
    _add_tiny_model_parser(sub)
    return parser


def _add_tiny_model_parser(sub) -> None:
    from tuneline.demo.tiny_model import TINY_PRESETS
    from tuneline.demo.tiny_vlm import VLM_PRESETS

    tiny = sub.add_parser("tiny-model", help="build an offline tiny model: a Llama, or a vision-language model",
                          description="Random weights, a tokenizer trained on the demo data and, for a "
                                      "vision-language preset, the family's processor files.")
    tiny.add_argument("out_dir")
    tiny.add_argument("--preset", default="demo", metavar="NAME",
                      help=f"text: {', '.join(TINY_PRESETS)}; vision-language: {', '.join(VLM_PRESETS)} "
                           "(default: demo)")
    tiny.add_argument("--seed", type=int, default=0)


def _add_sweep_parser(sub) -> None:
    from tuneline.pipeline.sweep_grid import GRID_HELP

    sweep = sub.add_parser("sweep", help="one training per point of a grid, compared in MLflow",
                           description="Runs the finetune flow once per point, each an MLflow child run of one "
                                       "parent run that holds the comparison table; the best child is tagged "
                                       "tuneline.sweep_best=true.")
    sweep.add_argument("config")
    sweep.add_argument("overrides", nargs="*", help="key=value for every point, typed as in YAML")
    sweep.add_argument("--grid", nargs="+", required=True, metavar="KEY=VALUES", help=GRID_HELP)
    sweep.add_argument("--samples", type=int, help="draw this many points at random (needed for LOW:HIGH ranges)")
    sweep.add_argument("--seed", type=int, default=0, help="the seed --samples draws with")
    sweep.add_argument("--max-parallel", type=int, default=1,
                       help="points in flight at once; trainings also wait for the 'gpu' concurrency limit")
    sweep.add_argument("--metric", default="eval_loss",
                       help="what picks the best point: a metric of the tuned model's evaluation, or train_loss")
    sweep.add_argument("--greater-is-better", action="store_true", help="higher --metric wins (default: lower)")


def _validate(args) -> int:
    config = checked_config(args.config, args.overrides)
    print(f"{args.config}: valid ({config.run_name}; output_dir {config.output_dir})")
    if not config.has_validation:
        from tuneline.evaluation import NO_VALIDATION

        print(f"note: this run will not be evaluated ({NO_VALIDATION})")
    return 0


def _preview(args) -> int:
    from tuneline.data import preview

    print(preview(load_config(args.config, args.overrides), n=args.n))
    return 0


def _export(args) -> int:
    from tuneline.export.merge import export_model, export_warnings

    folder = export_model(load_config(args.config, args.overrides))
    for warning in export_warnings(folder):
        print(f"warning: {warning}", file=sys.stderr)
    print(folder)
    return 0


def _chat(args) -> int:
    import tempfile
    from pathlib import Path

    from tuneline.data.mm.request_images import read_image
    from tuneline.serving.chat import Chat, calls_line, chat_loop, read_tools

    config = checked_config(args.config, args.overrides)
    tools = read_tools(args.tools) if args.tools is not None else None
    images = [read_image(path, f"--image {path}") for path in args.image]  # before the model loads
    with tempfile.TemporaryDirectory() as scratch:
        chat = Chat(config, Path(scratch), tools=tools, tools_source=args.tools or "the tool list",
                    images=bool(images))
        if args.prompt is not None:
            answer = chat.respond([{"role": "user", "content": args.prompt}], images=images)
            print(calls_line(answer.calls) if answer.calls else answer.text)
        else:
            chat_loop(chat, input, sys.stdout.write, images)
    return 0


def _api(args) -> int:
    from tuneline.serving.server import serve

    return serve(args.target, args.overrides)


def _retrain(args) -> int:
    import json

    from flows.retrain import checked_retrain_config, retrain

    checked_retrain_config(args.config, args.registered_model, args.overrides, args.min_delta, args.metric)
    print(json.dumps(retrain(args.config, args.registered_model, promotion_metric=args.metric,
                             greater_is_better=args.greater_is_better, promotion_min_delta=args.min_delta,
                             force=args.force, overrides=args.overrides), indent=2))
    return 0


def _sweep(args) -> int:
    from tuneline.pipeline.sweep_grid import parse_grid_args, plan_sweep

    grid = parse_grid_args(args.grid)
    options = {"samples": args.samples, "seed": args.seed, "overrides": args.overrides, "metric": args.metric,
               "max_parallel": args.max_parallel}
    plan_sweep(args.config, grid, **options)  # every point checked before Prefect starts a run

    from flows.sweep import sweep

    result = sweep(args.config, grid, greater_is_better=args.greater_is_better, **options)
    print(result["table"])
    print(f"best: {result['best_point']} (MLflow run {result['best_run_id']})")
    print(f"MLflow parent run: {result['mlflow_run_id']} {result['url'] or ''}".rstrip())
    return 0


def _serve(args) -> int:
    from pathlib import Path

    from cli.serving import serve_deployments

    if not Path(args.prefect_yaml).is_file():
        raise UserError(f"'{args.prefect_yaml}' does not exist: name a prefect.yaml, or start in the repository "
                        "that holds deployments/prefect.yaml")
    serve_deployments(Path(args.prefect_yaml))
    return 0


def _trigger(args) -> int:
    from cli.trigger import trigger

    run_id, page = trigger(args.deployment, args.assignments)
    print(f"flow run {run_id}\n{page}")
    return 0


def _ui(args) -> int:
    from pathlib import Path

    from cli.ui import serve_uis

    serve_uis(Path.cwd(), args.host, args.prefect_port, args.mlflow_port)
    return 0


def _train_node(args) -> int:
    from tuneline.pipeline.node import train_on_node

    rank = [] if args.machine_rank is None else [f"machine_rank={args.machine_rank}"]
    train_on_node(checked_config(args.config, [*args.overrides, *rank]), args.wait)
    return 0


def _tiny_model(args) -> int:
    from tuneline.demo.tiny_model import TINY_PRESETS, build_tiny_model
    from tuneline.demo.tiny_vlm import VLM_PRESETS, build_tiny_vlm

    if args.preset in VLM_PRESETS:
        print(build_tiny_vlm(args.out_dir, args.preset, seed=args.seed))
    elif args.preset in TINY_PRESETS:
        print(build_tiny_model(args.out_dir, seed=args.seed, **TINY_PRESETS[args.preset]))
    else:
        raise UserError(f"unknown preset '{args.preset}'; choose one of {', '.join([*TINY_PRESETS, *VLM_PRESETS])}")
    return 0


# A command's function, or "module:function" for one that lives with its flow (importing it imports Prefect).
COMMANDS = {"train": "flows.finetune:main", "predict": "flows.finetune:predict_main", "validate": _validate, "preview": _preview, "export": _export,
            "chat": _chat, "api": _api, "retrain": _retrain, "sweep": _sweep, "serve": _serve, "trigger": _trigger, "ui": _ui,
            "tiny-model": _tiny_model, "train-node": _train_node}


def _command(name: str) -> Callable:
    command = COMMANDS[name]
    if isinstance(command, str):
        module, _, function = command.partition(":")
        command = getattr(importlib.import_module(module), function)
    return command


def run(argv: list[str] | None = None) -> int:
    """The console command: its exit code, with a user's mistake as one message (code 2), never a traceback."""
    args = _parser().parse_args(argv)
    with report_user_errors() as reported:
        return _command(args.command)(args)
    return reported.exit_code


if __name__ == "__main__":
    sys.exit(run())
