-- bench/recompute.lua: activation recomputation's price and saving for a
-- GPT-2 (124M by default) on the CPU: for each batch size and policy (none,
-- selective, every:2, full) one forward + backward's time (the mean of
-- --iters after a warm-up, each from no gradients and a collected heap) and
-- the memory it needs above the model: what the forward leaves for the
-- backward (activations kept) and the peak during forward + backward less
-- the gradients (lt.memory_stats, the CPU allocator's live bytes), in MiB. The time ratio against none is the recompute's cost
-- (full: one more forward of every block, about a third more compute in
-- theory: a forward is a third of forward + backward).
--   ./lutra bench/recompute.lua [--model=gpt2] [--seq=256] [--batches=1,2,4] [--iters=2] [--threads=N]
local lt = require "lutra"
local args = {}
for _, a in ipairs(arg or {}) do
  local k, v = a:match("^%-%-([%w_]+)=(.*)$")
  if k then args[k] = v end
end
local name, T, iters = args.model or "gpt2", tonumber(args.seq or 256), tonumber(args.iters or 2)
local batches = {}
for b in (args.batches or "1,2,4"):gmatch("%d+") do batches[#batches + 1] = tonumber(b) end
if args.threads then lt.set_num_threads(tonumber(args.threads)) end
local POLICIES = { "none", "selective", "every:2", "full" }

print(("%s, sequence %d, f32, %d threads; forward + backward, %d timed after one warm-up"):format(name, T,
  lt.num_threads(), iters))
print(("%5s  %-10s %10s %8s %14s %12s %10s"):format("batch", "policy", "ms", "x none", "kept MiB", "peak MiB", "tokens/s"))
for _, B in ipairs(batches) do
  local base_ms
  for _, policy in ipairs(POLICIES) do
    local model = lt.models.gpt2(name, { block_size = T, generator = lt.Generator(1), recompute = policy })
    local g = lt.Generator(2)
    local x = lt.randint(0, 50257, { B, T }, { generator = g, dtype = "i64" })
    local y = lt.randint(0, 50257, { B, T }, { generator = g, dtype = "i64" })
    -- one forward + backward from a clean slate: no gradients, garbage collected; -> seconds,
    -- bytes live after the forward, the peak during both, both above the start, less the gradients
    local function step()
      model:zero_grad()
      collectgarbage()
      collectgarbage()
      local base = lt.memory_stats().allocated
      lt.reset_peak_memory_stats()
      local t0 = lt.clock()
      local l = model:loss(x, y)
      local kept = lt.memory_stats().allocated - base
      l:backward()
      local secs = lt.clock() - t0
      local grads = 0
      for _, p in ipairs(model:parameters()) do if p.grad ~= nil then grads = grads + p.grad:nbytes() end end
      return secs, kept, lt.memory_stats().peak - base - grads
    end
    step() -- (warm-up)
    local total, kept, peak = 0, 0, 0
    for _ = 1, iters do
      local s1, k1, p1 = step()
      total, kept, peak = total + s1, math.max(kept, k1), math.max(peak, p1)
    end
    local ms = total / iters * 1e3
    base_ms = base_ms or ms
    print(("%5d  %-10s %10.0f %8.2f %14.1f %12.1f %10.0f"):format(B, policy, ms, ms / base_ms, kept / 2 ^ 20,
      peak / 2 ^ 20, B * T / (ms / 1e3)))
    model = nil
    collectgarbage()
  end
end
print("(kept: the live bytes after the forward above the model, the activations the backward needs; peak: the most "
  .. "live during forward + backward above the model, less its gradients)")
