"""The PPO policy network for ResiliBench-v1: an RLlib (new API stack) torch RLModule with action masking.

Three encoders share one module (``model_config["encoder"]``):

* ``"pooled"`` (default) and ``"transformer"`` (the paper's policy network, appendix D.5): the state is a
  set of 31 tokens, one per tool (its status one-hot, required flag, next-required flag and legality, with
  the status of its dependencies, projected, plus a learned embedding of the tool's identity) and one task
  token (progress, counters and the 20 task features). Pre-norm blocks (no dropout) mix them: in
  ``"transformer"`` by self-attention, in ``"pooled"`` by adding a projection of the mean token to every
  token (a Deep Sets block, several times cheaper to train on CPU). Each tool token gives that tool's
  logit, the task token gives FINISH's, and the value head reads the task token beside the mean tool token.
* ``"mlp"``: the flat 204-float observation (265 under failure processes) through a fully connected trunk,
  with a policy and a value head.

Masking: the observation is ``MaskedPlannerEnv``'s Dict (``observations``, ``action_mask``); every forward
pass (exploration, inference, training) sets the logits of illegal actions to the most negative float, so
their probability is exactly 0: they are never sampled and never the argmax.
"""

from __future__ import annotations

__all__ = [
    "mask_logits", "dependency_matrix", "EncoderBlock", "PooledBlock", "ToolSetEncoder", "FlatEncoder", "PlannerModule",
]

from typing import Any

import gymnasium as gym
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis.value_function_api import ValueFunctionAPI
from ray.rllib.core.rl_module.torch import TorchRLModule
from torch import nn
from torch.nn import functional as F

from ...core.simulator import NOT_ATTEMPTED, SUCCESS
from ...envs.planner.observation import N_STATUS, ObservationLayout, check_features
from . import DEFAULT_MODEL_CONFIG, ENCODERS, quiet_logs
from .wrappers import ACTION_MASK, OBSERVATIONS

quiet_logs()  # this module is imported by every Ray process that builds the policy


def mask_logits(logits: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """Logits with illegal actions (mask 0) set to the most negative float of the dtype."""
    return torch.where(action_mask > 0.5, logits, torch.finfo(logits.dtype).min)


def dependency_matrix(n_tools: int) -> torch.Tensor:
    """[t, d] = 1 when tool t depends on tool d, from the default registry (the one the envs use)."""
    from ...core.registry import default_registry

    registry = default_registry()
    if len(registry) != n_tools:
        raise ValueError(f"the action space has {n_tools} tools, the registry {len(registry)}")
    matrix = torch.zeros(n_tools, n_tools)
    for t, deps in enumerate(registry.dependency_ids):
        matrix[t, list(deps)] = 1.0
    return matrix


def _mlp(sizes: list[int], out: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:], strict=True):
        layers += [nn.Linear(a, b), nn.ReLU()]
    layers.append(nn.Linear(sizes[-1], out))
    return nn.Sequential(*layers)


class EncoderBlock(nn.Module):
    """A pre-norm Transformer encoder block (self-attention, then a ReLU feed-forward), written out with
    ``scaled_dot_product_attention``: a third faster on CPU than ``nn.TransformerEncoderLayer`` in training."""

    def __init__(self, d_model: int, n_heads: int, ff_dim: int):
        super().__init__()
        self.n_heads = n_heads
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.ff = nn.Sequential(nn.Linear(d_model, ff_dim), nn.ReLU(), nn.Linear(ff_dim, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d)
        x = x + self.out(attended)
        return x + self.ff(self.norm2(x))


class PooledBlock(nn.Module):
    """A Deep Sets block: every token gets a projection of the (normalised) mean token, then a pre-norm
    ReLU feed-forward. It mixes the tokens as a set, like ``EncoderBlock``, at a fraction of attention's
    cost on CPU (the first norm acts on one pooled token, not on every token)."""

    def __init__(self, d_model: int, ff_dim: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.pool = nn.Linear(d_model, d_model)
        self.ff = nn.Sequential(nn.Linear(d_model, ff_dim), nn.ReLU(), nn.Linear(ff_dim, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.pool(self.norm1(x.mean(dim=1, keepdim=True)))
        return x + self.ff(self.norm2(x))


class ToolSetEncoder(nn.Module):
    """Tool tokens + task token -> set encoder blocks -> (31 logits, a pooled embedding for the value).

    A tool token carries the tool's observation entries (status one-hot, required, next-required or
    required order, legal) and, with ``relational`` (the "full" observation features), three relational
    features read off the registry's dependency graph: how many of its dependencies were never called, how
    many were called without success (the N_u and N_f of the failure model), and whether it is an unmet
    dependency of the next required tool. Without them the network must learn dependencies from the tools'
    identities and the outcomes of calls. Under failure processes a tool token also carries its
    rate-limit wait and whether its last call found it down; the time left joins the task token."""

    dependencies: torch.Tensor  # a buffer

    def __init__(self, layout: ObservationLayout, dependencies: torch.Tensor, d_model: int, n_heads: int,
                 n_layers: int, ff_dim: int, relational: bool = True, attention: bool = True):
        super().__init__()
        self.layout = layout
        self.relational = relational
        n = layout.n_tools
        self.register_buffer("dependencies", dependencies)  # [t, d] = 1 when tool t depends on tool d
        # With failure processes, two more entries per tool (turns rate-limited, last call found down).
        self.tool_features = nn.Linear(N_STATUS + 3 + 3 * relational + 2 * layout.processes, d_model)
        self.tool_identity = nn.Parameter(torch.randn(n, d_model) * 0.1)
        task_end = layout.blocked if layout.processes else layout.size
        self.task_slices = [(layout.progress, task_end)] + ([(layout.time_left, layout.size)] if layout.processes
                                                            else [])
        self.task_features = nn.Linear(sum(b - a for a, b in self.task_slices), d_model)
        self.encoder = nn.Sequential(*(EncoderBlock(d_model, n_heads, ff_dim) if attention
                                       else PooledBlock(d_model, ff_dim) for _ in range(n_layers)))
        self.norm = nn.LayerNorm(d_model)
        self.tool_logit = nn.Linear(d_model, 1)
        self.finish_logit = nn.Linear(d_model, 1)
        self.embedding_size = 2 * d_model

    def forward(self, obs: torch.Tensor, action_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lay, n = self.layout, self.layout.n_tools
        status = obs[:, lay.status:lay.required].reshape(-1, n, N_STATUS)
        next_required = obs[:, lay.next_required:lay.progress]
        flags = torch.stack([obs[:, lay.required:lay.next_required], next_required, action_mask[:, :n]], dim=-1)
        parts = [status, flags]
        if self.relational:
            uncalled, succeeded = status[..., NOT_ATTEMPTED], status[..., SUCCESS]
            deps_t = self.dependencies.t()
            parts.append(torch.stack([
                uncalled @ deps_t / 2.0,  # dependencies never called
                (1.0 - uncalled - succeeded) @ deps_t / 2.0,  # dependencies called, never successful
                (next_required @ self.dependencies) * (1.0 - succeeded),  # unmet dependency of the next tool
            ], dim=-1))
        if lay.processes:
            parts.append(torch.stack([obs[:, lay.blocked:lay.down], obs[:, lay.down:lay.time_left]], dim=-1))
        tools = self.tool_features(torch.cat(parts, dim=-1)) + self.tool_identity
        task = self.task_features(torch.cat([obs[:, a:b] for a, b in self.task_slices], dim=-1)).unsqueeze(1)
        h = self.norm(self.encoder(torch.cat([task, tools], dim=1)))
        logits = torch.cat([self.tool_logit(h[:, 1:]).squeeze(-1), self.finish_logit(h[:, 0])], dim=-1)
        return logits, torch.cat([h[:, 0], h[:, 1:].mean(dim=1)], dim=-1)


class FlatEncoder(nn.Module):
    """The flat observation and the mask through an MLP trunk -> (31 logits, the trunk's output)."""

    def __init__(self, layout: ObservationLayout, hiddens: list[int]):
        super().__init__()
        n_actions = layout.n_tools + 1
        self.trunk = _mlp([layout.size + n_actions, *hiddens[:-1]], hiddens[-1])
        self.policy = nn.Linear(hiddens[-1], n_actions)
        self.embedding_size = hiddens[-1]

    def forward(self, obs: torch.Tensor, action_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.trunk(torch.cat([obs, action_mask], dim=-1)))
        return self.policy(h), h


class PlannerModule(TorchRLModule, ValueFunctionAPI):
    """PPO RLModule over ``MaskedPlannerEnv``'s Dict observation; ``model_config`` keys: see
    ``DEFAULT_MODEL_CONFIG``."""

    def setup(self) -> None:
        # RLlib adds keys of its own (e.g. vf_share_layers); only ours are read.
        given = self.model_config or {}
        config = {k: given.get(k, default) for k, default in DEFAULT_MODEL_CONFIG.items()}
        if config["encoder"] not in ENCODERS:
            raise ValueError(f"model_config encoder must be one of {ENCODERS}, got {config['encoder']!r}")
        check_features(config["features"])
        if not isinstance(self.observation_space, gym.spaces.Dict) or set(self.observation_space) != {
                OBSERVATIONS, ACTION_MASK}:
            raise ValueError(f"PlannerModule needs a Dict observation with keys {OBSERVATIONS!r} and {ACTION_MASK!r} "
                             f"(wrap the env in MaskedPlannerEnv), got {self.observation_space}")
        n_tools = int(self.action_space.n) - 1
        layouts = {lay.size: lay for lay in (ObservationLayout(n_tools), ObservationLayout(n_tools, processes=True))}
        shape = self.observation_space[OBSERVATIONS].shape or ()
        layout = layouts.get(shape[0]) if len(shape) == 1 else None  # with failure processes or without
        if layout is None:
            raise ValueError(f"expected {' or '.join(map(str, layouts))} observation floats for {n_tools} tools "
                             f"(without or with failure processes), got shape {shape}")
        self.layout = layout
        if config["encoder"] in ("pooled", "transformer"):
            self.net = ToolSetEncoder(layout, dependency_matrix(n_tools), config["d_model"], config["n_heads"],
                                      config["n_layers"], config["ff_dim"], relational=config["features"] == "full",
                                      attention=config["encoder"] == "transformer")
        else:
            self.net = FlatEncoder(layout, list(config["mlp_hiddens"]))
        self.value_head = _mlp([self.net.embedding_size, *config["value_hiddens"]], 1)

    def set_state(self, state: dict[str, Any]) -> None:
        """Load weights; unlike RLlib's default (which skips missing ones silently), weights that do not
        fit this network, as from a checkpoint of another architecture, are a clear error."""
        missing = set(self.state_dict()) - set(state)
        if missing:
            raise ValueError(f"the weights do not fit this PlannerModule (encoder {self.model_config.get('encoder')!r}"
                             f" in its model_config): missing {sorted(missing)[:4]}{' ...' if len(missing) > 4 else ''}; "
                             "load the checkpoint with the model_config it was trained with")
        try:
            super().set_state(state)
        except RuntimeError as exc:  # a tensor of another shape (another width)
            raise ValueError(f"the weights do not fit this PlannerModule: {str(exc).splitlines()[-1].strip()}; "
                             "load the checkpoint with the model_config it was trained with") from None

    def _encode(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        obs = batch[Columns.OBS]
        mask = obs[ACTION_MASK]
        logits, embedding = self.net(obs[OBSERVATIONS], mask)
        return mask_logits(logits, mask), embedding, mask

    def _forward(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        logits, _, _ = self._encode(batch)
        return {Columns.ACTION_DIST_INPUTS: logits}

    def _forward_train(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        logits, embedding, _ = self._encode(batch)
        return {Columns.ACTION_DIST_INPUTS: logits, Columns.EMBEDDINGS: embedding}

    def compute_values(self, batch: dict[str, Any], embeddings: torch.Tensor | None = None) -> torch.Tensor:
        if embeddings is None:
            _, embeddings, _ = self._encode(batch)
        return self.value_head(embeddings).squeeze(-1)

    def greedy_actions(self, observations: torch.Tensor, action_masks: torch.Tensor) -> torch.Tensor:
        """The argmax of the masked logits for a batch of flat observations and masks (no RLlib batch)."""
        with torch.no_grad():
            out = self._forward({Columns.OBS: {OBSERVATIONS: observations, ACTION_MASK: action_masks}})
        return out[Columns.ACTION_DIST_INPUTS].argmax(dim=-1)
