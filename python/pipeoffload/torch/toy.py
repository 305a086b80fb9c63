"""A toy pipeline for the tests, the benchmark and the docs: virtual stages of residual MLP
blocks, their data, and a few training steps with any runner. Imports torch."""
import copy
from typing import Callable, List, Sequence

import torch


class Block(torch.nn.Module):
    """x + W2 gelu(W1 x): saves W1's input (T, h), gelu's input and W2's input (T, 4h). With
    dropout > 0, x + dropout(W2 gelu(W1 x)), which also saves the mask (T, h) and draws from the
    CUDA RNG (what a recompute must repeat bit for bit)."""

    def __init__(self, hidden: int, dropout: float = 0.0):
        super().__init__()
        self.up = torch.nn.Linear(hidden, 4 * hidden)
        self.down = torch.nn.Linear(4 * hidden, hidden)
        self.dropout = torch.nn.Dropout(dropout) if dropout > 0 else None

    def forward(self, x):  # (T, h) -> (T, h)
        if self.dropout is None:
            return x + self.down(torch.nn.functional.gelu(self.up(x)))
        return x + self.dropout(self.down(torch.nn.functional.gelu(self.up(x))))


def make_stages(num_virtual_stages: int, hidden: int, blocks_per_stage: int, device,
                seed: int = 0, dropout: float = 0.0) -> List[torch.nn.Module]:
    """num_virtual_stages stages of blocks_per_stage Blocks each, seeded (torch.manual_seed,
    which also seeds the CUDA RNG that dropout draws from)."""
    torch.manual_seed(seed)
    return [torch.nn.Sequential(*[Block(hidden, dropout)
                                  for _ in range(blocks_per_stage)]).to(device)
            for _ in range(num_virtual_stages)]


def make_data(num_microbatches: int, tokens: int, hidden: int, device, seed: int = 1):
    """Inputs and regression targets, (tokens, hidden) fp32 each, one pair per microbatch."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    inputs = [torch.randn(tokens, hidden, generator=generator).to(device)
              for _ in range(num_microbatches)]
    targets = [torch.randn(tokens, hidden, generator=generator).to(device)
               for _ in range(num_microbatches)]
    return inputs, targets


def mse_loss(num_microbatches: int) -> Callable:
    """Mean squared error scaled by 1/m, so the microbatches' gradients sum to the batch's."""
    def loss(output, target):
        return torch.nn.functional.mse_loss(output, target) / num_microbatches
    return loss


def train(stages: Sequence[torch.nn.Module], run_step: Callable, inputs, targets, steps: int,
          lr: float = 0.05):
    """`steps` SGD steps; run_step(inputs, targets) returns the microbatch losses and leaves the
    gradients. Returns (losses per step, parameters after each step), all copied."""
    params = [p for s in stages for p in s.parameters()]
    optimizer = torch.optim.SGD(params, lr=lr)
    losses, snapshots = [], []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=False)
        losses.append([l.clone() for l in run_step(inputs, targets)])
        optimizer.step()
        snapshots.append([p.detach().clone() for p in params])
    return losses, snapshots


def plain_step(stages: Sequence[torch.nn.Module], loss_fn: Callable):
    """A run_step that runs the microbatches one after another through all stages."""
    def run(inputs, targets):
        losses = []
        for x, target in zip(inputs, targets):
            for stage in stages:
                x = stage(x)
            loss = loss_fn(x, target)
            loss.backward()
            losses.append(loss.detach())
        return losses
    return run


def clone_stages(stages):
    return [copy.deepcopy(s) for s in stages]
