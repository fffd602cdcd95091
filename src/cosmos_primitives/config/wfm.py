"""``[wfm]``: world-model RL (FlowGRPO / DDRL) knobs (REFERENCE.md sections 3 and 4).

Example (the tiny CPU recipe; the Cosmos-Predict2.5-2B values are in
``examples/configs/cosmos_predict2_5_2b_flowgrpo.toml``)::

    [policy]
    model_name_or_path = "tiny"   # or a diffusers folder holding transformer/, vae/, scheduler/
    dtype = "float32"

    [policy.lora]
    r = 32
    lora_alpha = 64.0
    target_modules = ["to_q", "to_k", "to_v", "to_out.0"]

    [wfm]
    algorithm = "flow_grpo"       # or "ddrl", "diffusion_nft"
    num_samples_per_prompt = 8
    num_inference_steps = 10
    guidance_scale = 1.0          # read in the convention named by guidance_convention
    clip_range = 1e-3

    [wfm.sampler]
    sde_type = "flow_grpo"
    noise_level = 0.7

    [wfm.data]
    kind = "mock"
    num_frames = 5
    height = 16
    width = 16

The model, its dtype, LoRA and gradient checkpointing are ``[policy]``'s (the older spellings
``[wfm] model / dtype / gradient_checkpointing`` and ``[wfm.lora]`` are read with a warning); the
loop's own knobs (learning rate and its schedule, steps, seed, grad clip, checkpoints, output dir)
are ``[train]``'s; the reward service client is ``[remote_reward]``.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from cosmos_primitives.config.base import AtLeastOne, NonNegativeInt, Section


class WFMSamplerConfig(Section):
    """``[wfm.sampler]``: the stochastic (SDE) steps of a rollout.

    ``sde_type``:

    - ``"flow_grpo"``: ``std_t = noise_level * sqrt(sigma / (1 - sigma))`` (``1 - sigma_1`` in the
      denominator at ``sigma = 1``), Flow-GRPO's default;
    - ``"linear"``: ``std_t = noise_min + (noise_max - noise_min) * sigma`` (Cosmos / Wan schedule),
      same mean as ``"flow_grpo"``;
    - ``"cps"``: coefficients-preserving step, ``std = sigma_next * sin(noise_level * pi / 2)``.

    Only steps inside the SDE window are stochastic (and get a log-prob); the others are ODE (Euler)
    steps. ``sde_window_size = 0`` makes every step stochastic. Otherwise the window's first step is
    drawn per rollout batch, uniformly so that the window lies inside ``sde_window_range = [lo, hi)``
    (step indices; empty: all steps). Flow-GRPO-Fast uses e.g. size 2 within the first half.
    ``sde_window_mode = "sliding"`` (MixGRPO) instead starts the window at the range's first step and
    moves it ``sde_window_stride`` steps later every ``sde_window_shift_interval`` training steps,
    back to the start once it has passed the end (``cp.rollout.sliding_sde_window``).
    """

    sde_type: Literal["flow_grpo", "linear", "cps"] = "flow_grpo"
    noise_level: float = 0.7
    noise_min: float = 0.0
    noise_max: float = 0.7
    sde_window_size: int = 0
    sde_window_range: list[int] = msgspec.field(default_factory=list)
    # "random": a new window position per rollout batch; "sliding": MixGRPO's progressive window
    sde_window_mode: Literal["random", "sliding"] = "random"
    sde_window_shift_interval: int = 25
    sde_window_stride: int = 1
    # scheduler shift of the sigma grid; None: the model's scheduler config (3.0 for the tiny one)
    shift: float | None = None


class WFMDataConfig(Section):
    """``[wfm.data]``: the prompts (and, for DDRL, the real clips).

    ``kind = "clip_folder"`` reads ``path/videos/*.mp4``, ``path/metas/<same name>.txt`` and
    optionally ``path/text_embedding/<name>.npy`` / ``.safetensors`` (``.pickle`` / ``.pkl`` only with
    ``allow_pickle = true``: unpickling runs code from the file). ``kind = "mock"`` makes
    ``mock_num_samples`` random captions, embeddings and clips (quick runs, tests).

    ``kind = "webdataset"`` streams tar shards (``cp.data.WebDatasetClips``: per key an ``.mp4``, a
    ``.txt`` caption or ``"caption"`` in a ``.json``, optionally a ``.safetensors`` / ``.npy``
    embedding) named by ``shards``: local files, folders, globs, ``s3://bucket/prefix`` (every
    ``.tar`` under it) or one object; ``{000..099}`` ranges expand as in WebDataset. S3 is read with
    the ``AWS_*`` variables, each falling back to the seed's ``PROD_S3_CHECKPOINT_*`` one
    (``AWS_ENDPOINT_URL`` / ``PROD_S3_CHECKPOINT_ENDPOINT_URL`` for an S3-compatible store). The
    stream has no length: set ``[train] max_steps``. A checkpoint saves each rank's shard, the
    samples read in it and the bad samples counted so far; a resumed run goes on from there.

    Captions without a precomputed embedding are embedded by ``text_encoder``: ``"hash"`` is a tiny
    deterministic hashing embedder (no download; for CPU recipes and tests), ``"none"`` makes a
    missing embedding an error. Embeddings are zero-padded (or cut) to ``max_tokens`` rows with a mask.
    ``height`` / ``width`` are in pixels (``[768, 432]`` W x H for Cosmos-Predict2.5 480p).
    Bad clips (empty or undecodable video, caption not UTF-8, unreadable embedding) are skipped and
    counted under SFT's budget, ``[train.train_policy.dataset] bad_sample_budget``.
    """

    kind: Literal["mock", "clip_folder", "webdataset"] = "mock"
    path: str = ""
    # kind = "webdataset": shard files / folders / globs / s3:// prefixes, {a..b} ranges expanded
    shards: list[str] = msgspec.field(default_factory=list)
    num_frames: AtLeastOne = 5
    height: int = 16
    width: int = 16
    fps: float = 16.0
    max_tokens: int = 16
    text_dim: int = 32
    text_encoder: Literal["hash", "none"] = "hash"
    allow_pickle: bool = False
    mock_num_samples: AtLeastOne = 8
    # precomputed embedding of [wfm] negative_prompt (.npy / .safetensors), needed for guidance
    # with text_encoder = "none"; the hashing embedder embeds the negative prompt itself
    negative_embedding: str = ""
    # kind = "clip_folder": the folder under path holding <name>.npy / .safetensors / .pickle embeddings
    # (cosmos-rl's world-model datasets keep T5 embeddings in "t5_xxl")
    embedding_dir: str = "text_embedding"


class WFMConfig(Section):
    """``[wfm]``.

    Guidance: ``guidance_convention = "diffusers"`` reads ``guidance_scale`` as
    ``v = v_u + g (v_c - v_u)`` (``g = 1`` is no guidance); ``"cosmos"`` reads it as
    ``v = v_c + g (v_c - v_u)`` (``g = 0`` is no guidance).

    FlowGRPO loss: per trained step, PPO-clip with ``clip_range`` on the per-step ratio, advantages
    clamped to ``+-adv_clip_max``, plus ``kl_beta`` times the closed-form KL to the reference
    (``kl_reduction = "mean"`` averages the squared mean difference over latent elements as the
    log-probs are averaged, Flow-GRPO's code; ``"sum"`` is the exact KL of the whole step).
    Advantages: ``(r - mean_group) / (std + 1e-4)`` with the std of the prompt group
    (``advantage_std_scope = "group"``) or of the whole batch (``"batch"``).

    Advantages use the population std (``advantage_std = "population"``, Flow-GRPO's numpy) or the
    sample std (``"sample"``, torch's default, which cosmos-rl's world-model trainers use).

    Trained steps: a random ``train_step_fraction`` of the stochastic steps per update, or, when
    ``train_steps`` lists step indices (cosmos-rl's ``train_on``), those steps; each ``-1`` there is
    a step drawn at random per update from the steps not listed. Every step of an update
    accumulates into one optimizer step; ``loss_scale`` multiplies the loss before backward
    (cosmos-rl's world-model trainer scales it by 10, which matters for the gradient-norm clip).

    Groups across ranks: ``group_ranks = R`` spreads each prompt's ``num_samples_per_prompt``
    rollouts over ``R`` consecutive data-parallel ranks (cosmos-rl's world-model trainer: ``R =
    num_rollout``, one rollout per rank and prompt); the ranks of a group read the same prompts, roll
    out ``num_samples_per_prompt / R`` samples each and gather the group's rewards for the
    advantages. A run with fewer data ranks uses ``gcd(R, data ranks)``: the same groups, more
    samples per rank. ``shared_initial_noise``: every rollout of a group starts from the same
    initial noise (cosmos-rl's ``use_same_seed``); the SDE steps still draw their own.

    Reference (``kl_beta > 0``, full fine-tuning): ``reference_update_interval = N > 0`` copies the
    current weights into the reference before the rollouts of every step ``1, N + 1, 2N + 1, ...``
    (cosmos-rl's ``update_ref_every_iter``); 0 keeps the initial weights.

    DDRL (``algorithm = "ddrl"``): adds ``data_beta`` times the flow-matching loss on real clips,
    ``ddrl_rollout_noise`` / ``ddrl_rollout_sigma`` reuse the rollout's initial noise / the trained
    step's sigma for it, and ``advantage_transform = "neg_exp"`` maps ``A -> -exp(-A)`` (then clamps).

    Conditioning (Cosmos-Predict2.5's text2world / image2world / video2world): ``conditioning =
    "text"`` generates every latent frame from the caption; ``"image"`` also holds the clip's first
    frame (one latent frame) and ``"video"`` the clip's first ``num_conditional_frames`` latent frames
    (``(K - 1) * 4 + 1`` video frames with the 4x temporal VAEs of Cosmos / Wan) fixed: they are
    VAE-encoded, replace those frames of the noise and of every sampler step (frame replacement, the
    condition-mask channel set for Cosmos), and stay out of the log-probs and of every loss (FlowGRPO,
    its KL, DDRL's data term, DiffusionNFT). At least one latent frame must be left to generate.
    With ``min_num_conditional_frames`` set (``conditioning = "video"``), each step draws the number
    of condition frames uniformly from ``[min_num_conditional_frames, num_conditional_frames]``, the
    same for the whole batch (0: text-to-world that step), as cosmos-rl's world-model trainer does;
    evaluation uses ``num_conditional_frames``.

    DiffusionNFT (``algorithm = "diffusion_nft"``, ``cp.algo.diffusion_nft_loss``): ODE rollouts, then
    per sample ``nft_num_timesteps`` forward-process points with ``t`` uniform in ``[nft_t_min,
    nft_t_max]`` (``nft_timesteps = "uniform"``), or (``"sampler"``, cosmos-rl's) the rollout's own
    sigma grid in a random order per sample, its first ``nft_num_timesteps`` (at most the grid's
    ``num_inference_steps``); ``nft_beta`` is the implicit-policy step, ``adv_clip_max`` maps advantages to the
    optimality probability, ``kl_beta`` weighs the velocity KL to the reference; no guidance.
    """

    algorithm: Literal["flow_grpo", "ddrl", "diffusion_nft"] = "flow_grpo"
    num_samples_per_prompt: AtLeastOne = 8
    # prompts per rank per update (the name [grpo] uses; formerly [wfm.data] prompts_per_step); each is
    # rolled out num_samples_per_prompt times
    rollout_batch_size: AtLeastOne = 1
    num_inference_steps: AtLeastOne = 20
    eval_num_inference_steps: int = 40
    # evaluate (deterministic rollouts of fixed prompts and seeds) every eval_freq steps, and before the
    # first and after the last step; 0: only those two (eval_num_inference_steps = 0: never)
    eval_freq: int = 0
    # mp4 files per eval prompt under <run_dir>/samples/step_N/ (rewards of every sample in rewards.json)
    eval_videos_per_prompt: int = 2
    guidance_scale: float = 1.0
    guidance_convention: Literal["diffusers", "cosmos"] = "diffusers"
    negative_prompt: str = ""
    # "text": text2world; "image": the clip's first frame is the condition; "video": its first
    # num_conditional_frames latent frames (Cosmos-Predict2.5's name; 1 or 2 there)
    conditioning: Literal["text", "image", "video"] = "text"
    num_conditional_frames: AtLeastOne = 2
    min_num_conditional_frames: NonNegativeInt | None = None

    # loss
    clip_range: float = 1e-3
    adv_clip_max: float = 5.0
    advantage_std_scope: Literal["group", "batch"] = "group"
    advantage_std: Literal["population", "sample"] = "population"
    advantage_transform: Literal["none", "neg_exp"] = "none"
    kl_beta: float = 0.0
    kl_reduction: Literal["mean", "sum"] = "mean"
    data_beta: float = 0.0
    ddrl_rollout_noise: bool = True
    ddrl_rollout_sigma: bool = True
    ddrl_loss_weighting: Literal["velocity", "x0"] = "velocity"
    train_step_fraction: float = 1.0
    train_steps: list[int] = msgspec.field(default_factory=list)
    loss_scale: float = 1.0
    group_ranks: AtLeastOne = 1
    shared_initial_noise: bool = False
    reference_update_interval: NonNegativeInt = 0
    # optimizer steps per rollout batch (the rollout batch is split into this many mini-batches); each
    # accumulates the gradients of micro-batches of [train.train_policy] mini_batch samples (its memory)
    num_minibatches: AtLeastOne = 1
    # DiffusionNFT: the implicit-policy step beta, forward-process points per sample, their t range
    nft_beta: float = 1.0
    nft_num_timesteps: int = 1
    nft_t_min: float = 0.0
    nft_t_max: float = 1.0
    nft_timesteps: Literal["uniform", "sampler"] = "uniform"

    # true: every rank starts the reference reward server on loopback and points the [remote_reward]
    # client at it (rewards must be ones it hosts: brightness, contrast, colorfulness, media_stats);
    # false: the [remote_reward] URLs (or REMOTE_REWARD_* variables) name a running service
    start_reward_server: bool = False

    sampler: WFMSamplerConfig = msgspec.field(default_factory=WFMSamplerConfig)
    data: WFMDataConfig = msgspec.field(default_factory=WFMDataConfig)

    def condition_latent_frames(self, latent_frames: int) -> int:
        """How many leading latent frames of a ``latent_frames``-frame latent are the condition (0: text).

        Raises:
            ValueError: naming the keys, when the condition leaves no latent frame to generate.
        """
        if self.conditioning == "text":
            return 0
        k = 1 if self.conditioning == "image" else self.num_conditional_frames
        if k >= latent_frames:
            what = "its first frame" if self.conditioning == "image" else f"num_conditional_frames = {k} latent frames"
            raise ValueError(
                f"[wfm] conditioning = \"{self.conditioning}\" holds {what} of each clip fixed, but clips of "
                f"[wfm.data] num_frames = {self.data.num_frames} encode to only {latent_frames} latent frame(s): "
                "nothing would be left to generate. Raise [wfm.data] num_frames or lower [wfm] num_conditional_frames")
        return k

    def condition_frame_range(self, latent_frames: int) -> tuple[int, int]:
        """``(lo, hi)``: the numbers of condition latent frames a training step may draw (``lo == hi``
        unless ``min_num_conditional_frames`` is set).

        Raises:
            ValueError: naming the keys, for a range that is empty or leaves nothing to generate.
        """
        hi = self.condition_latent_frames(latent_frames)
        if self.min_num_conditional_frames is None:
            return hi, hi
        if self.conditioning != "video" or self.min_num_conditional_frames > hi:
            raise ValueError(
                f"[wfm] min_num_conditional_frames = {self.min_num_conditional_frames} needs conditioning = \"video\" "
                f"and at most num_conditional_frames = {self.num_conditional_frames} (conditioning = "
                f"\"{self.conditioning}\"): it is the low end of the range each step draws from")
        return self.min_num_conditional_frames, hi
