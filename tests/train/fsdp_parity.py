"""torchrun worker for tests/train/test_launch.py: N optimizer steps of Medusa heads on the tiny backbone, the
heads sharded with FSDP2 (`fully_shard`, gloo on CPU) when there is more than one rank, each rank taking its
share of the same global batch. Rank 0 writes the full (gathered) weights to OUT.

accelerate sets FSDP up on accelerators only, so this drives torch's FSDP2 directly with the loop's own pieces:
the method's step, and the loss normalized by the global target count (train/loop.py forward_loss).

usage: torchrun --nproc_per_node N tests/train/fsdp_parity.py DATA CACHE OUT
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from headstart.data import DataConfig, build_datasets, collate
from headstart.models.backbone import BackboneConfig, load_backbone
from headstart.models.checkpoint import build_drafter
from headstart.models.medusa import MedusaConfig
from headstart.train.steps import medusa_step

GLOBAL_BATCH, STEPS = 4, 3


def main(data: str, cache: str, out: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    backbone = load_backbone(BackboneConfig(name="tiny", path="tiny", dtype="float32"))
    if rank == 0:
        build_datasets(DataConfig(source=data, eval_rows=4, max_length=64), backbone.tokenizer, Path(cache))
    dist.barrier()  # the other ranks read the cache rank 0 wrote
    train, _, _ = build_datasets(
        DataConfig(source=data, eval_rows=4, max_length=64),
        backbone.tokenizer,
        Path(cache),
        show_progress=False,
    )
    torch.manual_seed(0)
    drafter = build_drafter("medusa", MedusaConfig(num_heads=2), backbone)
    if world > 1:
        mesh = init_device_mesh("cpu", (world,))
        for block in drafter.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(drafter, mesh=mesh)
        sharded = [p for p in drafter.parameters() if p.requires_grad]
        assert all(isinstance(p, DTensor) for p in sharded), "parameters are not sharded"
        assert sum(p.to_local().numel() for p in sharded) < sum(p.numel() for p in sharded)
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=1e-2)
    for step in range(STEPS):
        rows = range(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
        batch = collate([train[i] for i in rows[rank::world]], backbone.tokenizer.pad_token_id)
        loss_sum, count, _ = medusa_step(backbone, drafter, batch)
        global_count = count.detach().clone()
        dist.all_reduce(global_count)
        # as forward_loss: FSDP (like DDP) averages gradients over ranks, hence the world factor
        (loss_sum * world / global_count).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    state = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in drafter.state_dict().items()}
    if rank == 0:
        save_file({k: v.contiguous() for k, v in state.items()}, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
