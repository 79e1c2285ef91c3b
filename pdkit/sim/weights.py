"""SGLang's /weights_checker for the sim: its answer shape, with checksums made up from what decides a real
rank's weights (the model path, the rank's shard) plus PDKIT_SIM_WEIGHTS_SALT (issue 44 item 2).

Read in the pinned wheels (0.5.17 and 0.5.23 alike unless said):

- route: sglang/srt/entrypoints/http_server.py check_weights (0.5.17 :1486, 0.5.23 :1599), GET or POST,
  auth level ADMIN_OPTIONAL; body CheckWeightsReqInput (srt/managers/io_struct.py: action "checksum",
  allow_quant_error; 0.5.23 adds skip_tensor_list and selector "target" | "draft" | "all"), absent: the
  defaults. Answer `{"success", "message"[, "ranks", "per_engine_checksum"]}`, 200 on success, else 400.
- the fan-out (srt/managers/tokenizer_control_mixin.py check_weights): one reply per DP rank, messages
  joined with " | " (managers/communicator.py merge_results), `ranks` every reply's ChecksumInfo list,
  `per_engine_checksum` the sha256 of their `per_gpu_checksum`s in that order.
- one rank (srt/utils/weight_checker.py): `checksums` {tensor name: f"{tensor_hash:016x}"},
  `per_gpu_checksum` the sha256 over the sorted names and their hex (0.5.23 overall_checksum), and its
  placement {tp_rank, tp_size, dp_rank, dp_size, pp_rank, pp_size, rank, size}: one object in 0.5.17,
  a list of one per runner with `role` ("target") in 0.5.23 (weight_updater.py _merge_checksum_payloads).
  Only pp rank 0's schedulers reply (scheduler.py init_ipc_channels), so pp_rank is 0 throughout.
- other actions (WeightChecker.handle): "snapshot" and "reset_tensors" answer success without ranks
  (reset fills every weight with random values: the sim's checksums change); "compare" without a
  snapshot fails its assertion (an empty message, 400), after a reset it fails naming the tensors;
  an unknown action fails with `Unsupported action='...'`; 0.5.23 refuses an unknown selector, and
  "draft" without a draft model answers success without ranks.

The sim has no weights: each tensor's checksum is a sha256 of (model path, tensor name, tp rank and
size, salt, resets) cut to SGLang's 16 hex digits, so a restart with the same model, TP layout and salt
reports the same checksums, and another salt stands for a rank that loaded other weights.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

# a small stand-in for a model's named parameters
TENSORS = ("model.embed_tokens.weight", "model.layers.0.self_attn.qkv_proj.weight",
           "model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.gate_up_proj.weight",
           "model.layers.0.mlp.down_proj.weight", "model.layers.0.input_layernorm.weight", "model.norm.weight",
           "lm_head.weight")
SELECTORS = ("target", "draft", "all")


def overall_checksum(checksums: dict[str, str]) -> str:
    """SGLang's per_gpu_checksum: sha256 over the sorted tensor names and their checksums."""
    h = hashlib.sha256()
    for name in sorted(checksums):
        h.update(name.encode())
        h.update(checksums[name].encode())
    return h.hexdigest()


def per_engine_checksum(ranks: list[dict[str, Any]]) -> str:
    """SGLang's per_engine_checksum: sha256 over the ranks' per_gpu_checksum, in answer order."""
    h = hashlib.sha256()
    for rank in ranks:
        h.update(rank["per_gpu_checksum"].encode())
    return h.hexdigest()


@dataclass
class WeightsChecker:
    """One engine's weights, as its /weights_checker reports them."""

    model_path: str
    tp_size: int
    dp_size: int
    pp_size: int
    salt: str
    sglang_version: str  # "0.5.17" or "0.5.23": where parallelism_info's shape differs
    resets: int = 0
    snapshot_resets: int | None = None  # the resets count at the last snapshot; None: no snapshot

    def rank(self, tp_rank: int, dp_rank: int) -> dict[str, Any]:
        checksums = {}
        for name in TENSORS:
            seed = f"{self.model_path}\0{name}\0tp {tp_rank}/{self.tp_size}\0{self.salt}\0{self.resets}"
            checksums[name] = hashlib.sha256(seed.encode()).hexdigest()[:16]
        placement: dict[str, Any] = {"tp_rank": tp_rank, "tp_size": self.tp_size, "dp_rank": dp_rank,
                                     "dp_size": self.dp_size, "pp_rank": 0, "pp_size": self.pp_size,
                                     "rank": dp_rank * self.tp_size + tp_rank,
                                     "size": self.tp_size * self.dp_size * self.pp_size}
        if self.sglang_version == "0.5.17":
            parallelism: Any = placement
        else:
            parallelism = [{"role": "target", **placement}]
        return {"checksums": checksums, "per_gpu_checksum": overall_checksum(checksums),
                "parallelism_info": parallelism}

    def _one_reply(self, body: dict[str, Any]) -> tuple[bool, str, list[dict[str, Any]] | None]:
        """What one DP rank's scheduler replies: (success, message, payload)."""
        action = body.get("action", "checksum")
        if self.sglang_version != "0.5.17":
            selector = body.get("selector", "all")
            if selector not in SELECTORS:
                return False, f"invalid selector {selector!r}; expected 'target', 'draft', or 'all'", None
            if selector == "draft":
                return True, "Success.", None  # no draft model: no runner selected, no payload
        if action == "checksum":
            return True, "Success.", []
        if action == "snapshot":
            return True, "Success.", None
        if action == "reset_tensors":
            return True, "Success.", None
        if action == "compare":
            if self.snapshot_resets is None:
                return False, "", None  # `assert self._snapshot_tensors is not None`: no message
            if self.snapshot_resets != self.resets:
                return False, "check tensor equality failed:\n" + "\n".join(
                    f"name={name} (reset since the snapshot)" for name in TENSORS), None
            return True, "Success.", None
        return False, f"Unsupported action={action!r}", None

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON body) for one request BODY (CheckWeightsReqInput's fields)."""
        success, message, payload = self._one_reply(body)
        action = body.get("action", "checksum")
        if success and action == "snapshot":
            self.snapshot_resets = self.resets
        if success and action == "reset_tensors":
            self.resets += 1
        replies = max(1, self.dp_size)
        out: dict[str, Any] = {"success": success, "message": " | ".join([message] * replies)}
        if payload is not None:
            ranks = [self.rank(tp, dp) for dp in range(replies) for tp in range(self.tp_size)]
            out["ranks"] = ranks
            out["per_engine_checksum"] = per_engine_checksum(ranks)
        return (200 if success else 400), out
