import torch

from grpo_cli.datatypes import Rollout


def test_rollout_moves_every_tensor_and_keeps_the_text():
    r = Rollout(torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long),
                torch.ones(2, 4, dtype=torch.long), torch.zeros(2, dtype=torch.bool), ["a", "b"], ["c", "d"], torch.zeros(2, 4))
    m = r.to("meta")  # a device that exists everywhere; the engine uses accelerator.device
    for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "truncated", "sampling_logps"):
        assert getattr(m, k).device.type == "meta" and getattr(r, k).device.type == "cpu", k
    assert (m.prompts, m.completions, len(m)) == (["a", "b"], ["c", "d"], 2)
    assert Rollout(r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask, r.truncated, [], []).to("meta").sampling_logps is None
