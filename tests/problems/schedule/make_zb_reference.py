"""Regenerate zb_greedy_reference.json from the zero-bubble repository's own scheduler (not a test).

Run with a python that has torch and pulp, from a folder holding the repository's
megatron/core/pipeline_parallel/zerobubble/scheduler/{zb,graph}.py (sail-sg/zero-bubble-pipeline-parallelism
@39f2c186) with empty __init__.py files on the way: the cases are random per-stage costs and memory
limits, the orders are what zb.create_schedule returns.
"""
import json, random
from megatron.core.pipeline_parallel.zerobubble.scheduler import zb
rnd = random.Random(7)
cases = []
for k in range(30):
    p = rnd.choice([2, 3, 4]); m = rnd.choice([4, 6, 8])
    f = [round(rnd.uniform(0.5, 2.0), 3) for _ in range(p)]
    b = [round(rnd.uniform(0.5, 2.0), 3) for _ in range(p)]
    w = [round(rnd.uniform(0.2, 1.5), 3) for _ in range(p)]
    comm = rnd.choice([0.0, 0.1, 0.5])
    act = [float(rnd.choice([1, 2])) for _ in range(p)]
    mm = None if k % 2 == 0 else [a * rnd.choice([1, 2, p, p + 1, 2 * p]) for a in act]
    cfg = zb.GraphConfig(cost_f=f, cost_b=b, cost_w=w, cost_comm=comm, mem_f=act, mem_b=[0.0]*p,
                         mem_w=[-a for a in act], max_mem=mm, n_stages=p, n_micro=m)
    try:
        nodes = zb.create_schedule(cfg)
        orders = [[f"{n.type}{n.microbatch}" for n in st] for st in nodes]
    except ValueError as e:
        orders = str(e)
    cases.append(dict(p=p, m=m, f=f, b=b, w=w, comm=comm, act=act, max_mem=mm, orders=orders))
json.dump(cases, open("zb_greedy_reference.json", "w"))
print(len(cases), sum(isinstance(c["orders"], str) for c in cases))
