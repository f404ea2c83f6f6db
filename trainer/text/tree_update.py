"""The update on a tree as a tree: one forward pass over each shared prefix instead of one per row.

A tree-fork rollout's rows (one per episode or branch, :func:`trainer.text.text_train.build_batch`) share their
prefix tokens: every branch of a tree repeats its base's history up to the fork turn, and every episode of a
group repeats the first observation. The flat update pads the rows into ``[B, L]`` and runs the model over all
``B * L`` slots, so a prefix shared by ``m`` rows is computed ``m`` times.

:func:`pack_rows` merges the rows into a prefix trie (a node per distinct prefix, a token per node) and lays
the nodes out in packs: ``ids [P, N]`` with each node's depth as its position and an attention mask that lets a
node see exactly its ancestors and itself. A causal transformer then computes at every node the hidden state
the flat pass computes at every row position with that prefix (same tokens, same positions, same attended
set), so the log-prob of a row's token ``j`` is the log-softmax of its parent node's logits at the token's id
(:func:`tree_token_logprobs`), and the loss and its gradients equal the flat update's up to float rounding
(the gather's backward sums the contributions of the rows that share a node). This is the tree attention
mask of packed prefix trees, as in speculative decoding's token trees (SpecInfer, arXiv:2305.09781, section 4)
and in prefix-sharing RL updates (AReaL-DTA reports up to 8.31x on tau2-bench; TRL's tree packing is an open
pull request).

The model takes ``attention`` ``[P, N, N]`` bool and ``positions`` ``[P, N]``:
:meth:`trainer.text.lm.TinyCausalLM.forward` and :meth:`trainer.text.hf.HFCausalLM.forward` (a 4D mask, which
``transformers`` uses as given).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.text.text_policy import policy_log_softmax


@dataclass
class PackedTree:
    """Rows merged into a prefix trie and laid out in packs (see the module docstring).

    Attributes:
        ids: [P, N] int64 token of each node (``pad_id`` after a pack's last node).
        positions: [P, N] int64 depth of each node (its position in every row through it; 0 on padding).
        attention: [P, N, N] bool, True where query node i may attend key node j: j is i or an ancestor of i
            (a padding slot attends only itself).
        parent: [P, N] int64 slot of each node's parent in its pack (-1 at a row's first token and on padding).
        row_pack: [B] int64 pack of each row.
        row_nodes: [B, L] int64 slot of each row position's node in its pack (0 past the row's end).
        lengths: the rows' lengths.
        nodes: nodes over all packs (tokens the model computes).
        flat_tokens: ``B * L``, the slots of the flat padded batch.
    """

    ids: torch.Tensor
    positions: torch.Tensor
    attention: torch.Tensor
    parent: torch.Tensor
    row_pack: torch.Tensor
    row_nodes: torch.Tensor
    lengths: list[int]
    nodes: int
    flat_tokens: int


#: Default node cap of a pack, as a multiple of the longest row. A pack's attention costs ``N * N`` for N nodes
#: whatever the trie's shape, so a cap trades prefixes shared across packs against attention over nodes that do not
#: see each other. Measured (benchmarks/bench_tree_update.py's rows, ClueProbe T=5 with JSON tool schemas, 32 rows
#: of 263-348 tokens, forkyard's transformer on one CPU thread): forward and backward against the flat update 4.1x
#: faster for a tree rollout at 1.5x (3.5x at 3x, 2.9x at one pack), 2.2x for a 32-episode group (0.7x at one pack).
PACK_ROWS = 1.5


def pack_rows(rows: list[list[int]], pad_id: int, device, max_nodes: int | None = None) -> PackedTree:
    """Merge ``rows`` into prefix tries, at most ``max_nodes`` nodes per pack (a row longer than that gets a
    pack of its own). Rows are packed in sorted order, so rows sharing a prefix land in the same pack.

    Args:
        rows: B lists of token ids (unpadded), each non-empty.
        pad_id: the id put after a pack's last node.
        device: where the tensors go.
        max_nodes: node cap of a pack (the attention mask is ``N * N`` per pack); None: :data:`PACK_ROWS` times
            the longest row.

    Returns:
        A :class:`PackedTree`.

    Raises:
        ValueError: on no rows or an empty row.
    """
    if not rows or any(not r for r in rows):
        raise ValueError("pack_rows needs at least one row, none empty")
    if max_nodes is None:
        max_nodes = int(PACK_ROWS * max(len(r) for r in rows))
    order = sorted(range(len(rows)), key=lambda i: rows[i])
    packs: list[dict] = []  # per pack: children {(parent slot, token): slot}, tokens, depths, parents
    row_pack = [0] * len(rows)
    row_nodes: list[list[int]] = [[] for _ in rows]

    def new_pack() -> dict:
        packs.append({"child": {}, "tok": [], "depth": [], "parent": []})
        return packs[-1]

    pack = new_pack()
    for i in order:
        row = rows[i]
        # nodes this row would add to the current pack
        slot, shared = -1, 0
        for t in row:
            nxt = pack["child"].get((slot, t))
            if nxt is None:
                break
            slot, shared = nxt, shared + 1
        if pack["tok"] and len(pack["tok"]) + len(row) - shared > max_nodes:
            pack = new_pack()
        slot, slots = -1, []
        for depth, t in enumerate(row):
            nxt = pack["child"].get((slot, t))
            if nxt is None:
                nxt = len(pack["tok"])
                pack["child"][(slot, t)] = nxt
                pack["tok"].append(t)
                pack["depth"].append(depth)
                pack["parent"].append(slot)
            slot = nxt
            slots.append(slot)
        row_pack[i] = len(packs) - 1
        row_nodes[i] = slots
    n = max(len(p["tok"]) for p in packs)
    length = max(len(r) for r in rows)
    ids = torch.full((len(packs), n), pad_id, dtype=torch.long)
    positions = torch.zeros((len(packs), n), dtype=torch.long)
    parent = torch.full((len(packs), n), -1, dtype=torch.long)
    attention = torch.zeros((len(packs), n, n), dtype=torch.bool)
    attention[:, torch.arange(n), torch.arange(n)] = True
    for k, p in enumerate(packs):
        m = len(p["tok"])
        ids[k, :m] = torch.tensor(p["tok"])
        positions[k, :m] = torch.tensor(p["depth"])
        parent[k, :m] = torch.tensor(p["parent"])
    nodes = torch.zeros((len(rows), length), dtype=torch.long)
    for i, slots in enumerate(row_nodes):
        s = torch.tensor(slots)
        nodes[i, : len(slots)] = s
        # a node sees its ancestors: the nodes before it on any row through it (all rows agree)
        attention[row_pack[i]][s[:, None], s[None, :]] |= torch.ones(len(s), len(s), dtype=torch.bool).tril()
    return PackedTree(ids.to(device), positions.to(device), attention.to(device), parent.to(device),
                      torch.tensor(row_pack, device=device), nodes.to(device), [len(r) for r in rows],
                      sum(len(p["tok"]) for p in packs), len(rows) * length)


def tree_token_logprobs(model, packed: PackedTree, temperature: float = 1.0,
                        suppress: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row token log-probs and entropies from one forward pass over the packs: the values
    :func:`trainer.text.text_policy.token_logprobs` returns for the padded rows, up to float rounding, at every
    position inside a row (past a row's end: 0).

    Args:
        model: a :class:`trainer.text.lm.CausalLM` whose ``forward`` takes ``attention`` and ``positions``.
        packed: from :func:`pack_rows`.
        temperature, suppress: as :func:`trainer.text.text_policy.policy_log_softmax`.

    Returns:
        ``(logp, entropy)``: [B, L] float32 each, 0 at position 0 and past each row's end; entropy in nats of
        the distribution that predicted the position.
    """
    logits, _ = model(packed.ids, attention=packed.attention, positions=packed.positions)
    lp = policy_log_softmax(logits, temperature, suppress)  # [P, N, V]: node i's distribution of its child
    has_parent = packed.parent >= 0
    par = packed.parent.clamp_min(0)
    pack_index = torch.arange(lp.shape[0], device=lp.device)[:, None]
    node_lp = lp[pack_index, par, packed.ids]  # [P, N]: each node's log-prob under its parent's distribution
    node_ent = (-(lp.exp() * lp).sum(-1))[pack_index, par]
    zero = torch.zeros_like(node_lp)
    node_lp = torch.where(has_parent, node_lp, zero)
    node_ent = torch.where(has_parent, node_ent, zero)
    rows = packed.row_pack[:, None]
    inside = (torch.arange(packed.row_nodes.shape[1], device=lp.device)[None]
              < torch.tensor(packed.lengths, device=lp.device)[:, None])
    logp = torch.where(inside, node_lp[rows, packed.row_nodes], torch.zeros_like(packed.row_nodes, dtype=lp.dtype))
    ent = torch.where(inside, node_ent[rows, packed.row_nodes], torch.zeros_like(logp))
    return logp, ent
