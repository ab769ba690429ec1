"""DistributedDataParallel on the oxccl backend: a small model, one CPU process per rank."""
import torch
import torch.distributed as dist
import oxccl.torch  # noqa: F401 (registers the "oxccl" backend)

dist.init_process_group("oxccl")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
torch.manual_seed(1 + rank)  # each rank its own data
x = torch.randn(64, 8)
y = x.sum(dim=1, keepdim=True)
for step in range(20):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()  # DDP averages the gradients over oxccl here
    opt.step()
w = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
every = [torch.empty_like(w) for _ in range(dist.get_world_size())]
dist.all_gather(every, w)
print(f"rank {rank}: loss {loss.item():.4f}, same parameters on every rank: {all(torch.equal(w, v) for v in every)}")
