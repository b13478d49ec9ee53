"""Typed argument groups. Key names and defaults follow LLaMA-Factory so its YAML files work unchanged.

HF `TrainingArguments` keys are not repeated here: they live in `training_keys.py` and pass through."""

from __future__ import annotations

from dataclasses import dataclass

from tuneline.config.fields import arg
from tuneline.config.grpo_keys import GrpoArgs

STAGES = ("pt", "sft", "rm", "ppo", "dpo", "kto", "grpo", "rloo")  # grpo, rloo: tuneline's, on trl's trainers
FINETUNING_TYPES = ("lora", "oft", "freeze", "full")
ADAPTER_TYPES = ("lora", "oft")  # trained as a peft adapter, saved beside the base rather than merged
PREF_LOSSES = ("sigmoid", "hinge", "ipo", "orpo", "simpo")


@dataclass
class ModelArgs:
    # --- what to load
    model_name_or_path: str | None = arg(None, "Local folder or hub id of the base model.")
    adapter_name_or_path: str | None = arg(None, "Comma-separated LoRA adapters loaded (and merged) first.")
    adapter_folder: str | None = arg(None, "Folder holding adapter weights to load.")
    cache_dir: str | None = arg(None, "Where hub downloads go (LLaMA-Factory's meaning).")
    model_revision: str = arg("main", "Branch, tag or commit of the hub model.")
    hf_hub_token: str | None = arg(None, "Token for gated hub models (masked in MLflow).")
    trust_remote_code: bool = arg(False, "Run the model repo's own Python code; off unless you trust it.")
    use_fast_tokenizer: bool = arg(True, "Use the tokenizers-backed fast tokenizer.")
    resize_vocab: bool = arg(False, "Resize embeddings to the tokenizer's vocabulary.")
    split_special_tokens: bool = arg(False, "Tokenize special tokens as plain text.")
    add_special_tokens: str | None = arg(None, "Comma-separated special tokens to add.")
    add_tokens: str | None = arg(None, "Comma-separated ordinary (non-special) tokens to add; the embeddings grow "
                                       "to match.")
    new_special_tokens_config: str | None = arg(
        None, "A YAML file mapping each new special token to a description; its tokens replace "
              "'add_special_tokens', and the descriptions can initialise their embeddings ('init_special_tokens').")
    init_special_tokens: str = arg(
        "noise_init", "How the embedding rows of new tokens start: the mean of the old rows plus noise, the mean of "
                      "the token's description's embeddings, or that plus noise (the desc_* ones need "
                      "'new_special_tokens_config').", ("noise_init", "desc_init", "desc_init_w_noise"))
    model_max_length: int | None = arg(None, "The longest sequence the model takes: a 'cutoff_len' above it is "
                                             "refused, and the saved tokenizer truncates there.")
    use_kv_cache: bool = arg(True, "Keep the key/value cache while generating (evaluation, prediction, chat); "
                                   "training never keeps one.")
    enable_liger_kernel: bool = arg(False, "Train with liger-kernel's fused Triton kernels (RMSNorm, RoPE, SwiGLU, "
                                           "cross-entropy), through transformers; CUDA only.")
    low_cpu_mem_usage: bool = arg(True, "Load weights without a second full copy in memory.")
    # --- images and videos (vision-language models; part of the dataset's key: they set the token counts)
    image_max_pixels: int = arg(768 * 768, "Images above this many pixels are scaled down first.")
    image_min_pixels: int = arg(32 * 32, "Images below this many pixels are scaled up first.")
    video_max_pixels: int = arg(256 * 256, "Video frames above this many pixels are scaled down first.")
    video_min_pixels: int = arg(16 * 16, "Video frames below this many pixels are scaled up first.")
    video_fps: float = arg(2.0, "Frames sampled per second of video.")
    video_maxlen: int = arg(128, "Most frames sampled from one video.")
    image_do_pan_and_scan: bool = arg(
        False, "Gemma 3 (template gemma3) only: a wide or tall image also goes in as 2 to 4 crops after the whole "
               "image, each its own run of image tokens (LLaMA-Factory's pan and scan).")
    crop_to_patches: bool = arg(
        False, "InternVL (templates intern_vl, intern_s1) only: an image goes in as the grid of 1 to 12 tiles nearest "
               "its shape plus a thumbnail, each tile its own run of image tokens; off: one tile.")
    # --- how to compute
    attn_implementation: str = arg(
        "sdpa", "Attention kernel. sft training batches go padding-free wherever it can keep their examples apart "
                "(CPU: sdpa per example; CUDA: sdpa, flex_attention, flash_attention_2).",
        ("eager", "sdpa", "flex_attention", "flash_attention_2"))
    flash_attn: str = arg("auto", "LLaMA-Factory's attention switch; maps onto attn_implementation.",
                          ("auto", "disabled", "sdpa", "fa2"))
    disable_gradient_checkpointing: bool = arg(
        False, "Turn off gradient checkpointing, on when training as in LLaMA-Factory (less memory for one more "
               "forward pass per step); 'gradient_checkpointing: false' does the same.")
    use_reentrant_gc: bool = arg(True, "Reentrant checkpointing (LLaMA-Factory's default); false: PyTorch's "
                                       "non-reentrant kind, which FSDP2 runs always.")
    infer_dtype: str = arg("auto", "Dtype for inference.", ("auto", "float16", "bfloat16", "float32"))
    quantization_bit: int | None = arg(None, "QLoRA: 4 or 8 bit base weights via bitsandbytes (CUDA only).",
                                       (4, 8))
    quantization_method: str = arg("bnb", "Quantization backend.", ("bnb",))
    quantization_type: str = arg("nf4", "4-bit data type.", ("fp4", "nf4"))
    double_quantization: bool = arg(True, "Quantize the quantization constants too.")
    # --- export
    export_dir: str | None = arg(None, "Where `tuneline export` writes the merged model.")
    export_size: int = arg(5, "Shard size of the exported model, in GB.")
    export_device: str = arg("cpu", "Device used to merge for export.", ("cpu", "auto"))
    export_legacy_format: bool = arg(False, "Save .bin files instead of safetensors.")


@dataclass
class DataArgs:
    dataset: str | None = arg(None, "Comma-separated dataset names from dataset_info.json.")
    eval_dataset: str | None = arg(None, "Comma-separated evaluation dataset names.")
    dataset_dir: str = arg("data", "Folder holding dataset_info.json and the data files.")
    media_dir: str | None = arg(None, "Folder that relative image and video paths in the data start from; unset: "
                                      "dataset_dir, as in LLaMA-Factory.")
    template: str | None = arg(None, "Chat template name; unset or 'auto' uses the tokenizer's own.")
    cutoff_len: int = arg(2048, "Maximum tokens per example after tokenization.")
    train_on_prompt: bool = arg(False, "Compute loss on prompt tokens too.")
    mask_history: bool = arg(False, "Train only on the last assistant turn.")
    enable_thinking: bool | None = arg(True, "Reasoning templates: an answer without a thought gets an empty one, "
                                             "trained on; false: every thought is dropped and the empty one ends the "
                                             "prompt, not trained on (a model that answers without thinking).")
    preserve_thinking: bool = arg(False, "Reasoning templates: earlier answers keep their thoughts (else only the "
                                         "last answer's thought is kept where earlier turns are not trained on).")
    streaming: bool = arg(False, "Stream the dataset instead of loading it whole.")
    buffer_size: int = arg(16384, "Shuffle buffer when streaming.")
    mix_strategy: str = arg("concat", "How several datasets mix.", ("concat", "interleave_under", "interleave_over"))
    interleave_probs: str | None = arg(None, "Comma-separated sampling probabilities for interleaving.")
    overwrite_cache: bool = arg(False, "Rebuild the tokenized dataset even on a cache hit.")
    preprocessing_batch_size: int = arg(1000, "Rows per tokenization batch.")
    preprocessing_num_workers: int | None = arg(None, "Processes used to tokenize.")
    max_samples: int | None = arg(None, "Keep at most this many rows of each dataset (debugging).")
    ignore_pad_token_for_loss: bool = arg(True, "Never count pad tokens in the loss.")
    val_size: float = arg(0.0, "Held-out split: a fraction in (0, 1) or a row count >= 1.")
    packing: bool | None = arg(None, "Pack several examples per sequence without cross-attention.")
    neat_packing: bool = arg(False, "LLaMA-Factory's leak-free packing switch (tuneline packs leak-free always).")
    tool_format: str | None = arg(None, "Tool-call format of the template.")
    tool_date: str | None = arg(None, "Date llama3's tool prompt writes, e.g. '26 Jul 2024'; unset: the day the "
                                      "dataset is built (a cached dataset keeps its date).")
    default_system: str | None = arg(None, "System prompt used when a row has none.")
    tokenized_path: str | None = arg(None, "Explicit location of the tokenized-dataset cache entry.")
    on_bad_rows: str = arg("stop", "Malformed rows: stop with an error, or skip and report.", ("stop", "skip"))
    pad_to_multiple_of: int | None = arg(None, "Pad batches to a multiple of this (e.g. 8 for tensor cores).")


@dataclass
class FinetuningArgs:
    stage: str = arg("sft", "Training stage.", STAGES)
    finetuning_type: str = arg("lora", "Which parameters train (oft: an orthogonal peft adapter).", FINETUNING_TYPES)
    pure_bf16: bool = arg(False, "Load and train the model in bf16 without fp32 master weights or autocast (less "
                                 "memory, bf16 rounding in every update).")
    use_dft_loss: bool = arg(False, "sft: Dynamic Fine-Tuning loss, each label token's cross-entropy weighted by its "
                                    "(detached) probability.")
    plot_loss: bool = arg(False, "Save loss curves (tuneline always plots in the flow).")
    compute_accuracy: bool = arg(False, "Report token accuracy during sft evaluation.")
    early_stopping_steps: int | None = arg(None, "Stop after this many evaluations without improvement.")
    disable_shuffling: bool = arg(False, "Keep dataset order.")
    include_effective_tokens_per_second: bool = arg(False, "Report tokens/s over non-padding tokens.")
    use_eaft_loss: bool = arg(False, "sft: Entropy-Adaptive Fine-Tuning loss, each label token's cross-entropy "
                                     "weighted by (the entropy of its top-20 next-token distribution / 3) ** "
                                     "eaft_alpha, detached.")
    eaft_alpha: float = arg(1.0, "EAFT: exponent of the entropy weight.")
    use_asft_loss: bool = arg(False, "sft: Anchored SFT loss, the DFT loss plus asft_alpha times the KL divergence "
                                     "from the model as it was before training (a frozen copy).")
    asft_alpha: float = arg(0.1, "ASFT: weight of the KL term.")
    # --- FP8 training through accelerate (CUDA, Hopper or newer)
    fp8: bool = arg(False, "Train with FP8 matmuls: accelerate's fp8 mixed precision.")
    fp8_backend: str = arg("auto", "accelerate's FP8 backend; auto: torchao, else Transformer Engine, else MS-AMP.",
                           ("auto", "torchao", "te", "msamp"))
    fp8_enable_fsdp_float8_all_gather: bool = arg(False, "FSDP2 gathers the weights in FP8 (torchao backend).")
    # --- the torch profiler (traces under output_dir, logged to MLflow)
    enable_torch_profiler: bool = arg(False, "Record torch profiler traces of training steps.")
    profiler_output_dir: str | None = arg(None, "Where the traces go; default '<output_dir>/profiler'.")
    profiler_wait_steps: int = arg(1, "Steps skipped at the start of each profiling cycle.")
    profiler_warmup_steps: int = arg(1, "Steps the profiler warms up on (traced, then discarded) per cycle.")
    profiler_active_steps: int = arg(1, "Steps recorded per cycle.")
    profiler_repeat: int = arg(1, "Profiling cycles; 0: cycle until training ends.")
    profiler_record_shapes: bool = arg(True, "Record the shapes of operator inputs.")
    profiler_profile_memory: bool = arg(True, "Record tensor memory allocations.")
    profiler_with_stack: bool = arg(True, "Record the Python stack of each operator.")
    # --- LoRA
    lora_rank: int = arg(8, "LoRA rank.")
    lora_alpha: int | None = arg(None, "LoRA scale numerator; default 2 * lora_rank.")
    lora_dropout: float = arg(0.0, "Dropout on the LoRA path.")
    lora_target: str = arg("all", "Comma-separated module names, or 'all' linear layers.")
    additional_target: str | None = arg(None, "Modules trained fully and saved beside the adapter.")
    use_rslora: bool = arg(False, "Rank-stabilised LoRA scaling.")
    use_dora: bool = arg(False, "Weight-decomposed LoRA.")
    create_new_adapter: bool = arg(False, "Train a fresh adapter on top of loaded ones.")
    loraplus_lr_ratio: float | None = arg(None, "LoRA+: learning-rate ratio of B over A.")
    loraplus_lr_embedding: float = arg(1e-6, "LoRA+: learning rate of embedding adapters.")
    pissa_init: bool = arg(False, "PiSSA initialisation of the adapter.")
    pissa_iter: int = arg(16, "Fast-SVD iterations for PiSSA; -1 for exact SVD.")
    pissa_convert: bool = arg(False, "Save the PiSSA adapter as a plain LoRA adapter on the original weights.")
    # --- OFT (finetuning_type: oft; additional_target saves modules beside it as for LoRA)
    oft_rank: int = arg(0, "OFT rank (number of blocks); 0: derived from oft_block_size.")
    oft_block_size: int = arg(32, "OFT block size; 0: derived from oft_rank. Exactly one of the two is non-zero.")
    oft_target: str = arg("all", "Comma-separated module names given OFT, or 'all' linear layers.")
    module_dropout: float = arg(0.0, "OFT's multiplicative dropout (whole blocks set to identity).")
    # --- freeze
    freeze_trainable_layers: int = arg(2, "Trainable layers: last n if positive, first n if negative.")
    freeze_trainable_modules: str = arg("all", "Comma-separated module names trained in those layers.")
    freeze_extra_modules: str | None = arg(None, "Modules outside the layers that also train.")
    # --- vision-language models (lora, freeze and full alike; refused on a text-only model)
    freeze_vision_tower: bool = arg(True, "Keep the vision tower frozen: no LoRA on it, no freeze or full training "
                                          "of it.")
    freeze_multi_modal_projector: bool = arg(True, "Keep the projector (image features into the language model) "
                                                   "frozen; false trains it whole, under LoRA too (saved beside "
                                                   "the adapter).")
    freeze_language_model: bool = arg(False, "Keep the language model and its output layer frozen, so only the "
                                             "unfrozen image side trains.")
    # --- BAdam
    use_badam: bool = arg(False, "Block-coordinate-descent full tuning via the badam package.")
    badam_mode: str = arg("layer", "Which BAdam optimizer.", ("layer", "ratio"))
    badam_start_block: int | None = arg(None, "First block in layer mode.")
    badam_switch_mode: str = arg("ascending", "Block order.", ("ascending", "descending", "random", "fixed"))
    badam_switch_interval: int = arg(50, "Steps between block switches; -1 disables.")
    badam_update_ratio: float = arg(0.05, "Ratio of parameters updated in ratio mode.")
    badam_mask_mode: str = arg("adjacent", "Mask layout in ratio mode.", ("adjacent", "scatter"))
    badam_verbose: int = arg(0, "BAdam log level.")
    # --- other optimizers (full or freeze training; one of these, BAdam or LoRA+ at a time)
    use_galore: bool = arg(False, "GaLore: gradients projected to a low rank in the optimizer (galore-torch, through "
                                  "transformers' galore_* optimizers).")
    galore_target: str = arg("all", "Comma-separated module names whose Linear weights GaLore projects; 'all': "
                                    "every Linear layer but the output layer.")
    galore_rank: int = arg(16, "GaLore rank.")
    galore_update_interval: int = arg(200, "Steps between GaLore projection updates.")
    galore_scale: float = arg(2.0, "GaLore scale of the projected update.")
    galore_proj_type: str = arg("std", "GaLore projection side.", ("std", "reverse_std", "right", "left", "full"))
    galore_layerwise: bool = arg(False, "Update each parameter as soon as its gradient is ready (one process, "
                                        "gradient_accumulation_steps 1, no DeepSpeed).")
    use_apollo: bool = arg(False, "APOLLO: AdamW with low-rank scaled updates (apollo-torch, through transformers' "
                                  "apollo_* optimizers).")
    apollo_target: str = arg("all", "Comma-separated module names whose Linear weights APOLLO scales; 'all': every "
                                    "Linear layer but the output layer.")
    apollo_rank: int = arg(16, "APOLLO rank.")
    apollo_update_interval: int = arg(200, "Steps between APOLLO projection updates.")
    apollo_scale: float = arg(32.0, "APOLLO scale.")
    apollo_proj: str = arg("random", "APOLLO projection.", ("svd", "random"))
    apollo_proj_type: str = arg("std", "APOLLO projection side.", ("std", "right", "left"))
    apollo_scale_type: str = arg("channel", "APOLLO scaling granularity.", ("channel", "tensor"))
    apollo_scale_front: bool = arg(False, "Limit norm growth before APOLLO's scaling.")
    apollo_layerwise: bool = arg(False, "Update each parameter as soon as its gradient is ready (one process, "
                                        "gradient_accumulation_steps 1, no DeepSpeed).")
    use_adam_mini: bool = arg(False, "Adam-mini (the adam-mini package): one second-moment value per block.")
    use_muon: bool = arg(False, "Muon on 2-D weights (not embeddings or the output layer), AdamW on the rest.")
    # --- preference and RLHF
    pref_beta: float = arg(0.1, "Preference-loss temperature.")
    pref_ftx: float = arg(0.0, "Weight of the SFT loss added to the preference loss.")
    pref_loss: str = arg("sigmoid", "DPO-family loss.", PREF_LOSSES)
    dpo_label_smoothing: float = arg(0.0, "cDPO label smoothing in [0, 0.5).")
    kto_chosen_weight: float = arg(1.0, "KTO weight of desirable examples.")
    kto_rejected_weight: float = arg(1.0, "KTO weight of undesirable examples.")
    simpo_gamma: float = arg(0.5, "SimPO target reward margin.")
    ref_model: str | None = arg(None, "Reference model path; default: the policy without adapter, or a copy.")
    ref_model_adapters: str | None = arg(None, "Adapters applied to ref_model.")
    ref_model_quantization_bit: int | None = arg(None, "Quantize the reference model.", (4, 8))
    precompute_ref: bool | None = arg(None, "Compute reference log-probs once and cache them (dpo/kto default).")
    reward_model: str | None = arg(None, "Reward model for PPO: a full model or a LoRA adapter.")
    reward_model_adapters: str | None = arg(None, "Adapters applied to reward_model.")
    reward_model_type: str = arg("lora", "How reward_model is given (LLaMA-Factory's 'api' is not supported).",
                                 ("lora", "full"))
    ppo_buffer_size: int = arg(1, "Mini-batches (per_device_train_batch_size x gradient_accumulation_steps answers) "
                                  "sampled per PPO step.")
    ppo_epochs: int = arg(4, "PPO epochs per rollout batch.")
    ppo_score_norm: bool = arg(False, "Normalise rewards.")
    ppo_target: float = arg(6.0, "Target KL for adaptive KL control.")
    ppo_init_kl_coef: float = arg(0.05, "Starting KL-penalty coefficient, adapted towards ppo_target "
                                  "(tuneline key; trl's current PPO default).")
    ppo_whiten_rewards: bool = arg(False, "Whiten rewards before advantages.")


@dataclass
class GeneratingArgs:
    do_sample: bool = arg(True, "Sample instead of greedy decoding.")
    temperature: float = arg(0.95, "Sampling temperature.")
    top_p: float = arg(0.7, "Nucleus sampling mass.")
    top_k: int = arg(50, "Top-k sampling.")
    num_beams: int = arg(1, "Beam search width.")
    max_length: int = arg(1024, "Maximum total length when max_new_tokens is unset.")
    max_new_tokens: int = arg(1024, "Maximum generated tokens.")
    repetition_penalty: float = arg(1.0, "Penalty on repeated tokens.")
    length_penalty: float = arg(1.0, "Beam-search length penalty.")
    skip_special_tokens: bool = arg(True, "Drop special tokens when decoding.")


@dataclass
class PipelineArgs:
    """tuneline's own keys; names chosen not to collide with LLaMA-Factory's or transformers'."""

    run_name: str | None = arg(None, "Human name of the run; default '<stage>-<type> <model> <dataset>'.")
    pipeline_cache_dir: str = arg(".tuneline/cache", "Where cached step results (datasets, logps, evals) live.")
    refresh_cache: bool = arg(False, "Rerun every step even where a cached result exists.")
    discard_checkpoints: bool = arg(False, "Delete an output_dir's old checkpoints where a fresh start replaces "
                                    "them (refresh_cache, or overwrite_output_dir with settings a checkpoint cannot "
                                    "be resumed across); by default they are moved to '<output_dir>.superseded-<time>'.")
    mlflow_tracking_uri: str | None = arg(None, "MLflow store; default $MLFLOW_TRACKING_URI or sqlite:///mlflow.db.")
    mlflow_experiment: str | None = arg(None, "MLflow experiment; default '<stage>-<model name>'.")
    mlflow_registered_model: str | None = arg(None, "Register the final model under this name.")
    mlflow_log_checkpoints: bool = arg(False, "Log each complete checkpoint to MLflow.")
    eval_max_samples: int = arg(64, "Generated answers scored by `evaluate` (exact match, ROUGE, BLEU).")
    eval_max_new_tokens: int = arg(32, "Tokens generated per answer by `evaluate`.")
    num_processes: int | None = arg(None, "Training processes; default one per GPU, or 1 on CPU.")
    reward_model_config: str | None = arg(None, "ppo and grpo: a `stage: rm` config the flow runs first, as a "
                                          "cached subflow; its output becomes reward_model (grpo: one more "
                                          "reward_funcs item).")
    accelerate_config: str | None = arg(None, "An accelerate config file (e.g. FSDP) passed to the launcher.")
    num_machines: int = arg(1, "Machines that train together; with more than 1, the main machine (machine_rank 0) "
                            "runs `tuneline train` and each other one `tuneline train-node CONFIG --machine-rank N`. "
                            "'num_processes' counts the processes of one machine.")
    machine_rank: int = arg(0, "This machine's rank among 'num_machines' (0: the main one, which runs the flow); "
                            "`tuneline train-node --machine-rank N` sets it on the others.")
    main_process_ip: str | None = arg(None, "Address of the main machine (machine_rank 0) that the other machines "
                                      "reach; needed with 'num_machines' above 1.")
    main_process_port: int | None = arg(None, "Port on the main machine where the machines meet (default 29500 with "
                                        "several machines); the same on every machine.")


GROUPS: dict[str, type] = {
    "model": ModelArgs,
    "data": DataArgs,
    "finetuning": FinetuningArgs,
    "generating": GeneratingArgs,
    "pipeline": PipelineArgs,
    "grpo": GrpoArgs,
}
