-- tests/gpu/checks/training.lua: a tiny GPT-2 trained on both devices from
-- the same weights and batches: SGD in f32 (cuda losses match the cpu's),
-- AdamW in bf16 on cuda (cuDNN attention, then lutra's tensor-core
-- attention) tracking the cpu's f32 losses. 50 steps on a GPU, 20 on the
-- CUDA emulator.

local lt = require "lutra"
local C = require "tests.gpu.checks.harness"
local F = lt.F
local CUDA, EMULATED = C.CUDA, C.EMULATED
local check = C.check

--- A batch of 4 rows of 32 ids counting up by 3 from random starts (mod V),
-- and the same shifted by one as targets: a pattern a tiny model learns.
local function counting_batch(gen, V, device)
  local start = lt.randint(0, V, { 4 }, { generator = gen }):totable()
  local rows = {}
  for r = 1, 4 do
    rows[r] = {}
    for t = 1, 33 do rows[r][t] = (start[r] + 3 * t) % V end
  end
  local ids = lt.tensor(rows, "i64")
  return ids:narrow(2, 1, 32):to(device), ids:narrow(2, 2, 32):to(device)
end

-- the training runs: 50 steps on a GPU, 20 on the emulator (its block
-- barriers cost a fiber switch per thread: 50 steps took a minute each)
local STEPS = EMULATED and 20 or 50

check(STEPS .. " SGD steps of a tiny GPT-2: cuda losses match the cpu's", function()
  local function run(device)
    local model = lt.models.gpt2("gpt2-tiny", { generator = lt.Generator(42) })
    model:to(device)
    local gen = lt.Generator(3)
    local losses = {}
    for step = 1, STEPS do
      local x, y = counting_batch(gen, 512, device)
      local loss = model:loss(x, y)
      model:zero_grad()
      loss:backward()
      lt.no_grad(function()
        for _, p in ipairs(model:parameters()) do p:sub_(p.grad * 0.1) end
      end)
      losses[step] = loss:item()
    end
    return losses
  end
  local lc, lg = run("cpu"), run(CUDA)
  for step = 1, STEPS do
    local rel = math.abs(lc[step] - lg[step]) / math.abs(lc[step])
    assert(rel < 1e-3, ("step %d: cpu loss %.6f, cuda %.6f"):format(step, lc[step], lg[step]))
  end
  assert(lg[STEPS] < lg[1], ("the loss did not fall: %.4f -> %.4f"):format(lg[1], lg[STEPS]))
end)

--- STEPS AdamW steps of a tiny GPT-2 in bf16 on the device against f32 on the cpu; heads: the model's
-- head count (2 gives head size 32, which lutra's tensor-core attention takes)
local function tiny_gpt2_steps(heads)
  local function run(device, dtype)
    local model = lt.models.gpt2("gpt2-tiny", { generator = lt.Generator(42), vocab_size = 500, pad_vocab = 64,
      n_head = heads })
    model:to(device, dtype)
    local opt = lt.optim.AdamW(model, { lr = 3e-3, weight_decay = 0 })
    local gen = lt.Generator(3)
    local losses = {}
    for step = 1, STEPS do
      local x, y = counting_batch(gen, 500, device)
      local loss = model:loss(x, y, { count = false })
      loss:backward()
      opt:step()
      opt:zero_grad()
      losses[step] = loss:item()
    end
    return losses
  end
  local lc, lg = run("cpu", "f32"), run(CUDA, "bf16")
  local worst = 0
  for step = 1, STEPS do worst = math.max(worst, math.abs(lc[step] - lg[step]) / math.abs(lc[step])) end
  assert(worst < 5e-2, ("bf16 losses left the f32 ones by %.3g relative (last step: cpu %.4f, cuda %.4f)")
    :format(worst, lc[STEPS], lg[STEPS]))
  local fall = STEPS >= 50 and 0.8 or 0.9
  assert(lg[STEPS] < fall * lg[1], ("the loss did not fall: %.4f -> %.4f"):format(lg[1], lg[STEPS]))
end

check(STEPS .. " AdamW steps of a tiny GPT-2 in bf16 on cuda (cuDNN attention, epilogues, bf16 rows, padded head) track the cpu's f32 losses",
  function() tiny_gpt2_steps(4) end, true)
check(STEPS .. " AdamW steps of a tiny GPT-2 in bf16 on cuda with lutra's tensor-core attention (2 heads of 32) track the cpu's f32 losses",
  function()
    local library, fused = F.library_attention, F.fused_attention
    F.library_attention, F.fused_attention = false, true
    local ok, err = pcall(tiny_gpt2_steps, 2)
    F.library_attention, F.fused_attention = library, fused
    assert(ok, err)
  end, true)
