"""Float32 masters beside bfloat16 live weights (gmc.policy.masters): what the optimizer steps,
what the live weights become, and what a checkpoint restores."""

import torch

from gmc.policy.masters import MasterWeights


def test_masters_take_the_gradients_and_give_back_rounded_weights():
    live = torch.nn.Parameter(torch.tensor([0.02, 1.0, -3.0], dtype=torch.bfloat16))
    masters = MasterWeights([live])
    opt = torch.optim.SGD(masters.masters, lr=1e-6)
    (live.float() * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    masters.grads_in()
    assert live.grad is None and masters.masters[0].grad.dtype == torch.float32
    for _ in range(10):  # ten steps of 1e-6 on 0.02: lost in bfloat16 (8 bits), kept by the master
        opt.step()
    masters.weights_out()
    start = torch.tensor(0.02, dtype=torch.bfloat16).float()
    assert abs(float(masters.masters[0][0] - (start - 1e-5))) < 1e-8  # the master moved by 1e-5 (float32 steps)
    assert live.data[0] == start.to(torch.bfloat16)  # the live weight rounds back to where it was
    assert torch.equal(live.data, masters.masters[0].to(torch.bfloat16))


def test_loading_masters_restores_them_in_place_and_the_live_weights_from_them():
    live = torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))
    masters = MasterWeights([live])
    held = masters.masters[0]  # what an optimizer holds
    masters.load([torch.tensor([0.1, 0.2, 0.3, 1e-4])])
    assert masters.masters[0] is held and held[3] == torch.tensor(1e-4)
    assert torch.equal(live.data, held.to(torch.bfloat16))
    live.data.fill_(2.0)
    masters.load(None)  # a checkpoint without masters: from the live weights
    assert masters.masters[0] is held and torch.equal(held, torch.full((4,), 2.0))
