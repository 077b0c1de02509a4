"""The route agreement of two gloo ranks reduced by verl's real ``TrainingWorker.train_mini_batch``; prints JSON.

Each rank holds what its routers counted in the step (``RouterReplay`` counters on Megatron ``TopKRouter``s, as
``r3-route-agreement`` leaves them), different per rank and layer as data and pipeline parallelism split them:
rank 0 replayed 4 tokens of layer 1 (3 agree) and 2 of layer 2 (both agree), rank 1 replayed 4 tokens of layer 1
(1 agrees). Summed by layer: layer 1 4/8, layer 2 2/2, so the step's agreement is 0.75 and its minimum 0.5, on every
rank that returns verl's metrics. Only the worker around the engine is a stand-in (the attributes
``train_mini_batch`` reads). Run in fresh interpreters so verl's plugin discovery really runs.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import nullcontext
from types import SimpleNamespace

import torch
import torch.multiprocessing as mp

COUNTED = {0: {1: (3, 4), 2: (2, 2)}, 1: {1: (1, 4)}}  # rank -> layer_number -> (agreeing, replayed) tokens


def rank_main(rank: int, port: int, queue: mp.Queue) -> None:
    # plugin discovery happens at `import verl`; every rank of a Megatron R3 actor imports verl's replay module
    import torch.distributed as dist
    import verl.utils.megatron.router_replay_patch  # noqa: F401
    from megatron.core.transformer.moe.router import TopKRouter
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine_workers import TrainingWorker

    from verl_ascend_ext.features.routing.agreement import COUNTS
    from verl_ascend_ext.patching.status import acts_of, current

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    chunk = torch.nn.Module()
    chunk.decoder = torch.nn.ModuleList()
    for layer_number, counts in COUNTED[rank].items():
        router = TopKRouter.__new__(TopKRouter)  # what verl's iter_model_routers reads: the type, the number, replay
        torch.nn.Module.__init__(router)
        router.layer_number = layer_number
        router.router_replay = SimpleNamespace(**{COUNTS: torch.tensor(counts)})
        chunk.decoder.append(router)
    engine = SimpleNamespace(engine_config=SimpleNamespace(router_replay=SimpleNamespace(mode="R3")),
                             enable_routing_replay=True, tf_config=SimpleNamespace(num_layers=2), module=[chunk],
                             get_data_parallel_size=lambda: 2, get_data_parallel_rank=lambda: rank,
                             get_data_parallel_group=lambda: None, train_mode=lambda **kwargs: nullcontext(),
                             is_mp_src_rank_with_outputs=lambda: True)
    worker = TrainingWorker.__new__(TrainingWorker)
    worker.engine, worker.profiler = engine, SimpleNamespace(step=lambda: None)
    worker.train_batch = lambda mini_batch: tu.get_tensordict(tensor_dict={},
                                                              non_tensor_dict={"metrics": {"loss": [[0.5]]}})
    data = TensorDict({"input_ids": torch.nested.nested_tensor([torch.zeros(3, dtype=torch.long)] * 2,
                                                               layout=torch.jagged)}, batch_size=[2])
    tu.assign_non_tensor(data, mini_batch_size=4, epochs=1, seed=0, dataloader_kwargs={"shuffle": False})
    output = TrainingWorker.train_mini_batch(worker, data)
    queue.put({"rank": rank, "metrics": tu.get(output, "metrics"), "status": current("r3-route-agreement-metric")
               .status.value, "acts": acts_of("r3-route-agreement-metric"),
               "left_on_routers": [getattr(r.router_replay, COUNTS) for r in chunk.decoder]})
    dist.destroy_process_group()


def main() -> None:
    port = 29600 + os.getpid() % 300
    context = mp.get_context("spawn")
    queue = context.Queue()
    ranks = [context.Process(target=rank_main, args=(rank, port, queue)) for rank in (0, 1)]
    for process in ranks:
        process.start()
    results = sorted((queue.get(timeout=300) for _ in ranks), key=lambda r: r["rank"])
    for process in ranks:
        process.join(timeout=60)
    print(json.dumps({"ranks": results, "exit_codes": [p.exitcode for p in ranks]}))


if __name__ == "__main__":
    sys.exit(main())
