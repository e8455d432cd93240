"""ResNet-50 trained the way the performance guides say: bf16 autocast, model and images in
channels_last, SGD with momentum in its fused form, batch 128 of 224x224 images already on the GPU."""
import torch
import torch.nn.functional as F

from _common import half_dtype, reordered, rows, setup
from _convnets import resnet50

FIXES = {
    "launch_bound": "the whole step (forward, backward, fused SGD) captured once in a CUDA graph and replayed "
                    "(torch.cuda.graph, warm-up on a side stream; on the CPU the step as written)",
}

SIZES = {"tiny": dict(width=8, depths=(1, 1, 1, 1), image=64, classes=10, batch=8),
         "full": dict(width=64, depths=(3, 4, 6, 3), image=224, classes=1000, batch=128)}
N_BATCHES = 4


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    model = resnet50(cfg["classes"], cfg["width"], cfg["depths"], device=device)
    model = model.to(memory_format=torch.channels_last)
    fused = device.type == "cuda"
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4,
                          fused=fused, foreach=None if fused else True)
    dtype = half_dtype(device)

    B, S = cfg["batch"], cfg["image"]
    g = torch.Generator(device=device).manual_seed(seed)
    images = torch.randn(N_BATCHES * B, 3, S, S, device=device, generator=g)
    images = images.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, cfg["classes"], (N_BATCHES * B,), device=device, generator=g)
    perm = rows(B, reorder)
    k = 0

    def train(x, y, cache=True):
        with torch.autocast(device.type, dtype=dtype, cache_enabled=cache):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    def step():
        nonlocal k
        i = (k % N_BATCHES) * B
        x, y = reordered(perm, images[i:i + B], labels[i:i + B])
        k += 1
        return train(x, y)

    step.model = model
    if fix != "launch_bound" or device.type != "cuda":
        return step

    # The fix: one CUDA graph for the whole step. Warm-up steps on a side stream (cuDNN's choices, the
    # momentum buffers), then the weights, BatchNorm's statistics and the momentum go back to where they
    # started, so the graphed step trains the same model from the same point; the capture itself runs nothing.
    start = {n: t.detach().clone() for n, t in model.state_dict().items()}
    static_x, static_y = images[:B].clone(), labels[:B].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            train(static_x, static_y, cache=False)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = train(static_x, static_y, cache=False)
    with torch.no_grad():
        for n, t in model.state_dict().items():
            t.copy_(start[n])
        for state in opt.state.values():
            state["momentum_buffer"].zero_()      # 0.9 * 0 + g = g: SGD's first step, as written

    def graphed_step():
        nonlocal k
        i = (k % N_BATCHES) * B
        x, y = reordered(perm, images[i:i + B], labels[i:i + B])
        k += 1
        static_x.copy_(x)
        static_y.copy_(y)
        graph.replay()
        return static_loss

    graphed_step.model = model
    graphed_step.close = graph.reset
    return graphed_step
