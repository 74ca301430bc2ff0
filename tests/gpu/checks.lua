-- tests/gpu/checks.lua: the CUDA backend against PyTorch and against the CPU
-- backend, printed as TAP. Where no CUDA device is usable it prints
-- "skipped: no CUDA device (<reason>)" and succeeds.
--
--   1. every case of the PyTorch fixtures (tests/ref/ops.json, nn.json) run
--      on CUDA tensors built with the same strides, gradients included;
--   2. ops on fresh random inputs at training sizes, CUDA against CPU (f32
--      within 1e-5 relative to the largest value, bf16/f16 within 1e-2, no
--      NaN), forward and backward;
--   3. the generator draws the CPU's numbers; errors (bad indices, mixed
--      devices, out of memory) are clear and leave the process working;
--   4. 50 SGD steps (20 on the CUDA emulator) of a tiny GPT-2 on each device
--      from the same weights and batches give the same losses.
--
--   lutra tests/gpu/checks.lua ["name fragment" ...]
--
-- This file runs the checks of tests/gpu/checks/, one file a topic, in the
-- order below (each draws its random inputs after the one before it: the
-- order is part of the checks), with the shared harness of
-- tests/gpu/checks/harness.lua (the device, the name filter, check, close,
-- grad_check). Run from the repository's root, as make test does.
local lt = require "lutra"
local C = require "tests.gpu.checks.harness"

for _, topic in ipairs {
  "device",    -- the device, copies, memory, errors, the generator
  "fixtures",  -- the PyTorch fixtures (ops, nn, optim) on cuda; AdamW at GPT-2 sizes
  "ops",       -- unary, binary, reductions and matmul on random inputs
  "nn",        -- norms, losses, softmax, embedding, rope, activations
  "attention", -- fused, tensor-core, composed and cuDNN attention
  "linear",    -- linear and MLP through cuBLASLt's epilogues
  "indexing",  -- gather and scatter_add_
  "training",  -- a tiny GPT-2 trained on both devices
  "dist",      -- collectives, DataParallel and ZeRO on one rank
} do
  require("tests.gpu.checks." .. topic)
end

C.check("no kernel failed along the way", function() lt.cuda.synchronize() end, true)

C.finish()
