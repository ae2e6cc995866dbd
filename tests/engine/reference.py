"""Greedy generation with transformers, and the rule for comparing with it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TIE = 1e-4
"""Two logits closer than this are a tie that fp32 rounding may break either way."""


class Reference:
    """A transformers model that generates greedily and tells ties apart."""

    def __init__(self, path: Path) -> None:
        import torch
        import transformers

        self.torch = torch
        self.model: Any = transformers.AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32
        ).eval()
        # Greedy to the full length without suppressing any token: ``min_new_tokens``
        # would mask the end-of-sequence logit, which ``ignore_eos`` does not do.
        self.model.generation_config.eos_token_id = None

    def generate(self, prompt: list[int], max_tokens: int) -> list[int]:
        """``generate()``'s greedy tokens, never stopping early and never suppressing
        the end-of-sequence token (as tiny_engine's ``ignore_eos``)."""
        torch = self.torch
        with torch.no_grad():
            out = self.model.generate(
                torch.tensor([prompt]),
                max_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=0,
            )
        tokens = [int(t) for t in out[0, len(prompt) :]]
        assert len(tokens) == max_tokens, "transformers stopped early"
        return tokens

    def top_two_gap(self, tokens: list[int]) -> float:
        """The gap between transformers' two largest logits for the token after ``tokens``."""
        torch = self.torch
        with torch.no_grad():
            logits = self.model(torch.tensor([tokens])).logits[0, -1].double()
        top = torch.topk(logits, 2).values
        return float(top[0] - top[1])


def assert_matches(ref: Reference, prompt: list[int], ours: list[int], theirs: list[int]) -> None:
    """Equal token for token, or differing first where transformers' top two are a tie."""
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            gap = ref.top_two_gap(prompt + theirs[:i])
            assert gap < TIE, (
                f"token {i} differs ({a} vs transformers' {b}) although transformers' top two "
                f"logits are {gap:.2e} apart; ours {ours}, theirs {theirs}"
            )
            return
    assert len(ours) == len(theirs)
