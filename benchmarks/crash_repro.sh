#!/usr/bin/env bash
# Reproduce a crash of `python -m pulsar_py sample` outside pytest, with faulthandler.
cd /tmp
for dev in cpu cuda; do
  PYTHONFAULTHANDLER=1 python3 -X faulthandler -m pulsar_py sample --out /tmp/s_$dev.png --width 64 --height 48 --spheres 600 --device $dev
  echo "exit code ($dev): $?"
done
PYTHONFAULTHANDLER=1 python3 -c "
import torch, pulsar_py
r = pulsar_py.Renderer(64, 48)
pos = torch.rand(100, 3) + torch.tensor([0, 0, 10.0]); col = torch.rand(100, 3); rad = torch.full((100,), 0.3)
print(r(pos, col, rad, torch.tensor([0, 0, 0, 0, 0, 0, 5.0, 2.0]), gamma=0.1, max_depth=30.0).mean())
"
echo "exit code (plain cpu render): $?"
