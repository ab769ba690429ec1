"""FSDP2 on the oxccl backend (PyTorch 2.x): each layer's parameters sharded over the ranks, one CPU process per rank."""
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

dist.init_process_group("oxccl")  # found through the oxccl package's entry point: no import needed
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                            torch.nn.Linear(64, 1))
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer, mesh=mesh)  # this layer's parameters: 1/world of them on each rank
fully_shard(model, mesh=mesh)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
torch.manual_seed(1 + rank)  # each rank its own data
x = torch.randn(64, 8)
y = x.sum(dim=1, keepdim=True)
for step in range(20):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()  # FSDP2 all-gathers the parameters and reduce-scatters the gradients over oxccl
    opt.step()
rows = model[2].weight.to_local().shape[0]
print(f"rank {rank}: loss {loss.item():.4f}, holds {rows} of the 64 rows of the second layer's weight")
dist.destroy_process_group()
