#!/usr/bin/env python3
"""Writes a TorchScript UNet of random weights (fixed seed) for benchmarks: the issue-sized CPU yardstick.

    python3 scripts/make_unet.py OUT.pt [--levels 2] [--base 16] [--cin 3] [--cout 2] [--seed 0]

`--levels L` down/up levels (max-pooling, transposed convolutions, skip connections), `--base` channels at the
top, doubled at each level; two 3x3 convolutions with ReLU per block and a 1x1 head. Scripted (torch.jit.script),
so any window size whose sides divide by 2^L runs.
"""
import argparse

import torch


def block(cin, cout):
    c = torch.nn.Conv2d
    return torch.nn.Sequential(c(cin, cout, 3, padding=1), torch.nn.ReLU(), c(cout, cout, 3, padding=1),
                               torch.nn.ReLU())


class UNet(torch.nn.Module):
    def __init__(self, levels: int, base: int, cin: int, cout: int):
        super().__init__()
        widths = [base * 2**i for i in range(levels + 1)]
        self.down = torch.nn.ModuleList([block(cin, widths[0])] +
                                        [block(widths[i], widths[i + 1]) for i in range(levels)])
        self.up = torch.nn.ModuleList(
            [torch.nn.ConvTranspose2d(widths[i + 1], widths[i], 2, stride=2) for i in reversed(range(levels))])
        self.merge = torch.nn.ModuleList([block(2 * widths[i], widths[i]) for i in reversed(range(levels))])
        self.head = torch.nn.Conv2d(base, cout, 1)

    def forward(self, x):
        skips = []
        for i, down in enumerate(self.down):
            if i > 0:
                skips.append(x)
                x = torch.nn.functional.max_pool2d(x, 2)
            x = down(x)
        for up, merge in zip(self.up, self.merge):
            x = merge(torch.cat([up(x), skips.pop()], 1))
        return self.head(x)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--levels", type=int, default=2)
    p.add_argument("--base", type=int, default=16)
    p.add_argument("--cin", type=int, default=3)
    p.add_argument("--cout", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    torch.manual_seed(a.seed)
    model = torch.jit.script(UNet(a.levels, a.base, a.cin, a.cout).eval())
    model.save(a.out)
    print(f"{a.out}: {sum(t.numel() for t in model.parameters())} parameters")


if __name__ == "__main__":
    main()
