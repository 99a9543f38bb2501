"""The configuration schema: one frozen dataclass per group of sparrow/conf/.

Every field has a default so that `sparrow train` runs with no arguments (the embedded
default: tiny built-in model, synthetic task, CPU). Field comments are the reference; the YAML
files in sparrow/conf/ repeat them above each key.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModelConfig:
    # a local Hugging Face directory, or "builtin:tiny" for the embedded default model
    path: str = "builtin:tiny"
    # weights dtype: auto (bf16 on GPU, fp32 on CPU), float32, bfloat16, float16
    dtype: str = "auto"
    # auto (cuda when available), cpu, cuda, cuda:N
    device: str = "auto"
    # longest total sequence (prompt + generation); 0 takes the model's own limit
    max_context: int = 0


@dataclass(frozen=True)
class RolloutConfig:
    # rollout engine: native (the project's engine) or vllm (dense decode on GPUs through
    # vLLM 0.23, with schedule.sparse=false; docs/backends.md)
    backend: str = "native"
    # samples generated per prompt (the GRPO group size)
    samples_per_prompt: int = 8
    # generation cutoff in new tokens
    max_new_tokens: int = 1024
    # sampling temperature; 0 means greedy
    temperature: float = 1.0
    # nucleus sampling mass; 1.0 keeps the whole distribution
    top_p: float = 1.0
    # keep only the k most likely tokens; 0 keeps all
    top_k: int = 0
    # top tokens and logprobs returned per generated token (the acceptance lower bound uses them)
    logprobs_topk: int = 20
    # KV cache memory per engine in MiB (used when gpu_memory_utilization is 0 or on CPU)
    kv_cache_mib: int = 256
    # on GPU: size the KV cache, at each rollout, so the device's used memory reaches this
    # share of its total (vLLM's gpu_memory_utilization; native: the same size while it
    # fits, docs/engine.md); 0 uses kv_cache_mib
    gpu_memory_utilization: float = 0.0
    # on GPU: free the KV cache between rollouts so scoring and the update have the memory
    release_memory: bool = True
    # keep generating past the model's eos tokens (benchmarks of fixed lengths)
    ignore_eos: bool = False
    # most sequences decoded at once by one engine
    max_batch_size: int = 64
    # base seed; each request derives its own
    seed: int = 0
    # rollout actors; 0 means one per GPU, or one on a machine without GPU
    num_actors: int = 0
    # with a trainer group (trainer.num_workers > 0) on GPUs: colocated puts one engine on
    # each trainer rank's GPU (the KV cache released while the trainer works); separate gives
    # the engines GPUs of their own
    placement: str = "colocated"
    # 0: each engine takes prompts while it runs, its own share first, then those waiting
    # behind a full engine (sparrow/runtime/rollout/dispatch.py; vLLM: one item per engine); N > 0:
    # separate work items of N prompts handed to whichever actor is free
    work_item_prompts: int = 0
    # launch each decode step before the host has read the previous one's tokens (same results)
    overlap: bool = True
    # page centroids' dtype: cache (the KV cache's) or float8_e4m3fn (half the bytes page
    # scoring reads; selection changes slightly, and calibration replays with this setting)
    centroid_dtype: str = "cache"
    # GPU kernels launched with programmatic dependent launch (Hopper and later): all, none,
    # linear (decode projections) or attention (norm + RoPE, scoring, top-k, attention)
    programmatic_launch: str = "all"
    # decode projections of up to 16 rows in the weight-streaming kernel; false uses cuBLAS
    skinny_linear: bool = True
    # a decode layer's RMSNorms and residual adds folded into its projections' kernels
    fold_norms: bool = True
    # keep the decode CUDA graphs while the engine sleeps and replay them after waking when
    # its KV cache lies where it did (false: capture them again after every wake)
    keep_graphs: bool = True


@dataclass(frozen=True)
class ScheduleConfig:
    # a preset name (sparrow schedule list), a calibrated schedule's name, or a YAML file path
    name: str = "tiny-0.86"
    # false decodes densely (the baseline every sparse run is compared with)
    sparse: bool = True
    # acceptance p5 target per length bin
    target: float = 0.86
    # per-bin statistic held at the target: p5 (the paper's), p1, p10, mean, min, or
    # share_below_half (lower is better: target is then the largest share allowed)
    target_statistic: str = "p5"
    # page-scoring rule (docs/selection.md): centroid, centroid_maxhead, quest, quest_maxhead,
    # or oracle (teacher-forced replay only: calibrate.sample_sparse=false; never decodes)
    selection: str = "centroid"
    # (layer, KV head) pairs that read every page on sparse layers, e.g. [[2, 0], [5, 3]]
    dense_heads: list[list[int]] = field(default_factory=list)
    # tokens per KV page; 0 keeps the schedule's, else its token budgets in pages of this size
    page_size: int = 0


@dataclass(frozen=True)
class DistillConfig:
    # DistillSparse: a LoRA used only by the sparse actor, pulled toward the dense policy
    enabled: bool = False
    # LoRA rank
    lora_rank: int = 16
    # LoRA scaling alpha (the update is scaled by alpha / rank)
    lora_alpha: int = 32
    # projections that carry the LoRA (any of q_proj k_proj v_proj o_proj gate_proj up_proj down_proj)
    targets: list[str] = field(
        default_factory=lambda: [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ]
    )
    # divergence: k3 (sampled-token estimate r - log r - 1, r = p_dense / p_sparse) or full_kl
    # (exact KL(dense || sparse) over the vocabulary)
    loss: str = "k3"
    # weight of the divergence in the LoRA loss
    kl_coef: float = 1.0
    # weight of a PPO term (algo.loss on the sparse forward, the rollout as old policy); 0 off
    ppo_coef: float = 0.0
    # LoRA learning rate = algo.lr x lr_scale (AdamW of its own)
    lr_scale: float = 5.0
    # update the LoRA every N steps (between, the engines keep the last one)
    every: int = 1
    # also measure acceptance without the LoRA on the same tokens (one more sparse forward)
    measure: bool = True
    # measure the LoRA on a schedule one notch cheaper (each bin one budget of the controller's
    # grid lower; one more sparse forward) and let the controller switch to it once it holds
    # schedule.target (sparrow-method.md section 8: 0.80 with the LoRA reaches 0.86's p5)
    switch_to_cheaper: bool = False
    # distill measurements in a row the cheaper schedule must hold the target before a switch
    switch_patience: int = 2
    # the cheaper schedule must reach target + this margin (the target statistic's axis)
    switch_margin: float = 0.0
    # free the distiller's base weights (the policy in the compute dtype) while the engines
    # roll out; the next distill step rebuilds them from the trainer's weights, as it would
    release_during_rollout: bool = True


@dataclass(frozen=True)
class CorrectionConfig:
    # masked IS (mis_token, mis_sequence): a token's / sequence's p_dense_old / p_actor above
    # this cap masks it (instead of truncating it, as TIS does)
    mis_cap: float = 2.0
    # icepop: tokens whose p_dense_old / p_actor lies outside [icepop_low, icepop_high] are masked
    icepop_low: float = 0.5
    # icepop: upper bound of the kept band
    icepop_high: float = 5.0
    # geo_mask: sequences whose geometric mean of p_dense_old / p_actor lies outside
    # [geo_low, geo_high] are masked
    geo_low: float = 0.99
    # geo_mask: upper bound of the kept band
    geo_high: float = 1.01


@dataclass(frozen=True)
class AlgoConfig:
    # advantage estimator (registry name): grpo, rloo
    advantage: str = "grpo"
    # policy loss (registry name): ppo_clip (TIS), mis_token, mis_sequence, icepop, geo_mask
    loss: str = "ppo_clip"
    # lower clip range of the PPO ratio
    eps_low: float = 0.2
    # upper clip range of the PPO ratio
    eps_high: float = 0.28
    # truncated importance sampling cap C on p_dense_old / p_actor; negative turns TIS off
    tis_cap: float = 2.0
    # loss aggregation: token_mean or sequence_mean
    loss_agg: str = "token_mean"
    # epsilon added to the group std in GRPO
    adv_eps: float = 1.0e-6
    # policy learning rate (AdamW): the embedded tiny model's; the paper's runs used 1e-6
    lr: float = 3.0e-4
    # AdamW weight decay
    weight_decay: float = 0.0
    # gradient norm clip; 0 disables
    grad_clip: float = 1.0
    # tokens per micro-batch in dense scoring and the update
    micro_batch_tokens: int = 8192
    # optimizer passes over each step's rollouts
    ppo_epochs: int = 1
    # tokens whose [tokens, vocab] logits exist at once in scoring and the update
    logits_chunk_tokens: int = 4096
    # recompute each layer's activations in the backward (long sequences fit; ~30% more work)
    gradient_checkpointing: bool = False
    # on GPU: weights and optimizer moments go to host memory while the rollout runs
    offload_during_rollout: bool = False
    # with a compute dtype below fp32 (bf16 on GPU): the model holds bf16 parameters and
    # AdamW steps fp32 master copies; false keeps fp32 parameters under autocast
    master_weights: bool = True
    # one torch.rms_norm kernel per RMSNorm instead of transformers' elementwise chain
    # (sparrow/trainer/fused_norms.py); off until measured on a GPU
    fused_norms: bool = False
    # torch.compile each decoder layer (sparrow/trainer/compiled_layers.py): fused elementwise
    # work and less host overhead; null (the default) turns it on where the trainer runs on
    # CUDA in one process (not in a trainer group: not yet tested there on GPUs)
    compile_layers: bool | None = None
    # the float32 log-softmax over each chunk of logits compiled, in scoring and the update
    # (sparrow/trainer/logprobs.py: bf16 logits read once; the update's chunks keep only their
    # normalizer and recompute the logits in the backward); null: as compile_layers
    compile_logprobs: bool | None = None
    # thresholds of the masking mismatch corrections (algo.loss mis_*, icepop, geo_mask)
    correction: CorrectionConfig = field(default_factory=CorrectionConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)


@dataclass(frozen=True)
class DataConfig:
    # training prompts: a Parquet/JSONL path, or "builtin:NAME" for a synthetic task
    train: str = "builtin:synthetic"
    # evaluation prompts (same forms); empty disables evaluation
    eval: str = ""
    # reward function: exact_match, math, module:function or path/to/file.py:function
    reward: str = "exact_match"
    # column holding the prompt text
    prompt_key: str = "prompt"
    # column holding the ground-truth answer
    answer_key: str = "answer"
    # prompts per RL step
    prompts_per_step: int = 8
    # longest prompt in tokens; a longer one is an error naming the row
    max_prompt_tokens: int = 1024
    # seconds one reward call may take before it scores 0
    reward_timeout_s: float = 10.0
    # share of a step's samples whose reward call may raise (each scores 0); more stops the run
    reward_max_error_share: float = 0.5


@dataclass(frozen=True)
class PipelineConfig:
    # every run's files, the DuckDB file and the MLflow store live here
    workdir: str = "./sparrow-work"
    # run id; empty makes a new one, an existing one resumes
    run_id: str = ""
    # RL steps to run
    steps: int = 8
    # fail a stage on purpose, as STAGE@STEP (for testing resume); empty disables
    fail_at: str = ""
    # kill the process (SIGKILL) as STAGE@STEP, once the stage has written its files but before
    # it is recorded (fault-injection tests); empty disables
    kill_at: str = ""
    # checkpoint every K steps; 0 only at the end
    checkpoint_every: int = 0
    # policy_update folders (full trainer state) that keep their tensors: the newest K; 0 all
    keep_checkpoints: int = 2
    # also keep the policy_update folder of every N-th step; 0 none beyond keep_checkpoints
    keep_every: int = 0
    # on GPU: write each step's trainer state in the background, overlapping the next rollout
    background_save: bool = True
    # evaluate every K steps; 0 never
    eval_every: int = 0
    # 0: evaluate greedily (the policy's best answer); > 0: one sample per eval prompt at this
    # temperature (the policy's sampled accuracy, which RL raises once greedy is right); dense
    eval_temperature: float = 0.0
    # re-optimize the schedule every K steps even without a threshold event; 0 never
    reoptimize_every: int = 0
    # at the end of the run, write its report (plots and summary.md, what `sparrow report`
    # writes) into runs/<run_id>/report and MLflow's plots/; false skips it (a few seconds)
    report: bool = True
    # MLflow tracking URI; empty means sqlite:///<workdir>/mlflow.db
    mlflow_uri: str = ""
    # base seed of the run (data order, sampling, initialisation)
    seed: int = 0


@dataclass(frozen=True)
class CalibrateConfig:
    # calibration prompts (same forms as data.train); empty uses data.train
    prompts: str = ""
    # prompts sampled for calibration (rows 0.. of the dataset's order)
    num_prompts: int = 8
    # samples per prompt (the paper repeated each prompt 8 times)
    repeats: int = 4
    # new tokens per sample; 0 takes rollout.max_new_tokens
    max_new_tokens: int = 0
    # true: each top-k of the grid is measured on the sparse actor's own samples under it
    # (on-policy; predicts a train step's p5); false: on dense samples (one sampling run)
    sample_sparse: bool = True
    # the grid of top-k pages replayed (was `budgets`); empty: the paper's steps 29..1149
    # below the longest trajectory, or a small grid (1..64) when fewer than 4 of them fit
    topk_pages: list[int] = field(default_factory=list)
    # fewest tokens a bin needs for a stable p5; a thinner bin takes its neighbour's decision
    min_tokens: int = 100
    # bins of the calibrated schedule; 0 keeps schedule.name's count (more if trajectories
    # reach further)
    num_bins: int = 0
    # name of the calibrated schedule; empty names it calibrated-<model folder>-<target>
    name: str = ""
    # hardware preset of the cost model that prices each budget (sparrow costmodel --help)
    hardware: str = "h200"
    # also time generating every budget of the grid (the paper's way) to compare with calibration
    time_generation: bool = False
    # online control: a bin counts as below target when its p5 < schedule.target - tolerance
    tolerance: float = 0.0
    # online control: steps in a row below target before a bin's budget is raised
    patience: int = 1
    # online control: on the pipeline.reoptimize_every timer, bins whose p5 >= target + margin
    # try a lower budget
    margin: float = 0.05
    # online control: trajectories replayed per re-measurement, the longest of the step's
    # (every bin they reach keeps tokens); 0 replays all
    remeasure_samples: int = 4


@dataclass(frozen=True)
class TrainerConfig:
    # trainer ranks as Ray actors (FSDP2, one GPU each; gloo on CPU); 0 keeps the trainer in
    # the flow's own process (one GPU shared with the engine)
    num_workers: int = 0
    # bucket size of the weight broadcast to the rollout engines, in MiB
    sync_bucket_mib: int = 256


@dataclass(frozen=True)
class RayConfig:
    # Ray cluster address; empty starts a local Ray
    address: str = ""


@dataclass(frozen=True)
class SparrowConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    data: DataConfig = field(default_factory=DataConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    calibrate: CalibrateConfig = field(default_factory=CalibrateConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


# groups whose YAML file is chosen by sparrow/conf/config.yaml's defaults (or `group=name` overrides)
GROUPS = ("model", "rollout", "schedule", "algo", "data", "pipeline", "calibrate")

# fields with a closed set of values; names from registries are checked in load.py
CHOICES: dict[str, tuple[str, ...]] = {
    "model.dtype": ("auto", "float32", "bfloat16", "float16"),
    "rollout.backend": ("native", "vllm"),
    "rollout.placement": ("colocated", "separate"),
    "rollout.centroid_dtype": ("cache", "float8_e4m3fn"),
    "rollout.programmatic_launch": ("all", "none", "linear", "attention"),
    "algo.loss_agg": ("token_mean", "sequence_mean"),
    "algo.distill.loss": ("k3", "full_kl"),
}
