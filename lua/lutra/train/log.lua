--- lutra.train.log (lt.train.log): lt.train's record of a run: the lines it
-- prints and the JSON lines it appends to <dir>/metrics.jsonl, and the
-- numbers on a step's line (MFU's peak and FLOPs per token, memory, times).
--
--   local log = lt.train.log.open { dir = "runs/mine" }
--   log:record { step = 1, loss = 3.2 }        -- one JSON line, flushed
--   log:say("step 1 | loss 3.2")               -- printed (rank 0 only, unless told)
--   log:close()
local runtime = require "lutra.runtime"
local cuda = require "lutra.cuda"
local json = require "lutra.json"
local comm = require "lutra.dist.comm"
local records = require "lutra.dist.tp.records"
local tensor = require "lutra.tensor"

local M = {}

--- lt.train.log.format_bytes(b) -> "12.3 MiB" (under 1 GiB) or "1.25 GiB".
function M.format_bytes(b)
  if b >= 2 ^ 30 then return ("%.2f GiB"):format(b / 2 ^ 30) end
  return ("%.1f MiB"):format(b / 2 ^ 20)
end
local fmt_bytes = M.format_bytes

--- lt.train.log.format_time(seconds) -> "0:42", "12:05" or "1:02:05" ("?" for NaN or infinity).
function M.format_time(t)
  if t ~= t or t == math.huge then return "?" end
  t = math.floor(t + 0.5)
  local h, m, sec = math.floor(t / 3600), math.floor(t / 60) % 60, t % 60
  if h > 0 then return ("%d:%02d:%02d"):format(h, m, sec) end
  return ("%d:%02d"):format(m, sec)
end
local fmt_time = M.format_time

--- lt.train.log.json_line(t) -> t as one line of JSON; JSON has no NaN or
-- infinities: they are written as the strings "nan", "inf", "-inf".
function M.json_line(t)
  local clean = {}
  for k, v in pairs(t) do
    if type(v) == "number" and (v ~= v or v == math.huge or v == -math.huge) then
      v = v ~= v and "nan" or (v > 0 and "inf" or "-inf")
    end
    clean[k] = v
  end
  return json.encode(clean)
end

--- lt.train.log.default_peak(device) -> flops, text: the peak FLOP/s MFU is
-- measured against: 989e12 on CUDA (H100/H200 dense bf16), else cores x
-- 2.5 GHz x 32 f32 FLOPs per cycle (AVX2 FMA): a stated assumption, printed
-- with the numbers.
function M.default_peak(device)
  if device:sub(1, 4) == "cuda" then return 989e12, "989 TFLOP/s (H100/H200 bf16 dense)" end
  local cores = runtime.num_threads()
  local peak = cores * 2.5e9 * 32
  return peak, ("%.0f GFLOP/s (%d core%s x 2.5 GHz x 32 f32 FLOPs/cycle, assumed)"):format(peak / 1e9, cores,
    cores == 1 and "" or "s")
end

--- lt.train.log.num_parameters(model) -> the whole model's parameter
-- elements, as one process's model:num_parameters(): a tensor-parallel
-- model's shards counted whole (lt.dist.tp.records.num_parameters), and a
-- pipeline stage model's (model.pp) summed over its pipeline group, the
-- last stage's copy of a tied head (lm_head.weight, the first stage's
-- embedding) left out. Collective over model.pp.group for a stage model
-- (one all_reduce of one f64): every rank of the pipeline calls it.
function M.num_parameters(model)
  local P = rawget(model, "pp")
  if not P then return records.num_parameters(model) end
  local g, by = rawget(model, "tp_group"), records.sharded(model)
  local n = 0
  for _, np in ipairs(model:named_parameters()) do
    local name, p = np[1], np[2]
    -- (by name, not P.copy: model:to() may have replaced the tensor)
    if not (P.copy and name == "lm_head.weight") then n = n + p:numel() * ((by[p] and g) and g:size() or 1) end
  end
  local t = tensor.tensor({ n }, { dtype = "f64" })
  comm.all_reduce(t, { group = P.group })
  return t:item()
end

--- lt.train.log.flops_per_token(model, T) -> llm.c's FLOPs per token for a
-- transformer with a config (GPT-2's n_layer, n_embd or Llama's n_layers,
-- dim) at sequence length T: 6N + 6 L C T, N the whole model's parameters
-- (M.num_parameters: a tensor-parallel model's shards counted whole, a
-- pipeline's stages summed; L the whole model's blocks, config.n_layer,
-- on every stage); nil for a model without that config. Collective over
-- the pipeline group for a stage model (M.num_parameters).
function M.flops_per_token(model, T)
  local cfg = model.config
  if not cfg then return nil end
  local L, C = cfg.n_layer or cfg.n_layers, cfg.n_embd or cfg.dim
  if not L or not C then return nil end
  return M.transformer_flops(M.num_parameters(model), L, C, T)
end

--- lt.train.log.transformer_flops(N, L, C, T) -> 6N + 6 L C T: the FLOPs
-- a token costs in a training step (forward and backward) of a
-- transformer with N parameters, L blocks of width C, at sequence length
-- T (llm.c's count, as PaLM's appendix B: 6N for the weights' products,
-- 6 L C T for attention's; the planner, lutra.plan, counts the same).
function M.transformer_flops(N, L, C, T) return 6 * N + 6 * L * C * T end

--- lt.train.log.memory_now(device) -> bytes in live tensors now, their peak
-- (lt.cuda.memory_stats on CUDA, lt.memory_stats on the CPU).
function M.memory_now(device)
  if device:sub(1, 4) == "cuda" then
    local s = cuda.memory_stats(device)
    return s.allocated, s.peak
  end
  local s = runtime.memory_stats()
  return s.allocated, s.peak
end

--- lt.train.log.mkdir_p(path[, level = 2]): creates the directory and its
-- parents; raises "train: cannot create the directory <path> (<mkdir's
-- words>)" at level (as error()'s, counted from mkdir_p: 2 blames its caller).
function M.mkdir_p(path, level)
  local q = "'" .. path:gsub("'", "'\\''") .. "'"
  local p = io.popen("mkdir -p " .. q .. " 2>&1 && echo ok")
  local out = p:read("*a")
  p:close()
  if not out:find("ok\n$") then -- (mkdir's own words say why)
    error(("train: cannot create the directory %s (%s)"):format(path, (out:gsub("%s+$", ""))), level or 2)
  end
end

--- lt.train.log.step_line(t) -> the line lt.train prints for a step: t =
-- {step =, steps =, loss =, mean =, mean_steps =, lr =, grad_norm =, ms =,
-- tokens_per_s =, mfu = (a fraction, or nil: "n/a"), mem =, mem_peak =
-- (bytes), elapsed_s =, eta_s =, skipped = (true: marked "skipped (not finite)")}.
function M.step_line(t)
  return ("step %5d/%d | loss %.4f | mean(%d) %.4f | lr %.2e | norm %.3f | %6.0f ms | %7.0f tok/s | MFU %s | mem %s, peak %s | %s, ETA %s%s")
    :format(t.step, t.steps, t.loss, t.mean_steps, t.mean, t.lr or 0, t.grad_norm, t.ms, t.tokens_per_s,
      t.mfu and ("%.1f%%"):format(t.mfu * 100) or "n/a", fmt_bytes(t.mem), fmt_bytes(t.mem_peak), fmt_time(t.elapsed_s),
      fmt_time(t.eta_s), t.skipped and " | skipped (not finite)" or "")
end

local Log = {}
Log.__index = Log

--- lt.train.log.open{dir =, quiet = false, ddp = (an lt.dist.DataParallel),
-- log_all_ranks = false[, level = 2]} -> log: opens <dir>/metrics.jsonl for
-- appending (creating dir) on the lead rank (rank 0 under ddp, else this
-- process); under ddp every rank of the job (a DataParallel over a DP
-- group: the other groups' too) learns whether rank 0 could and raises
-- with it. log.metrics_path is the file, log.lead whether this rank writes
-- it. Raises "train: cannot open <file>: <reason>" or mkdir_p's error at
-- level (2: open's caller).
function M.open(o)
  local level = o.level or 2
  local ddp = o.ddp or nil
  local self = setmetatable({ dir = o.dir, metrics_path = o.dir .. "/metrics.jsonl", quiet = o.quiet, ddp = ddp,
    log_all_ranks = o.log_all_ranks }, Log)
  -- under data parallelism rank 0 alone prints, warns and writes the metrics
  self.lead = not ddp or comm.rank() == 0
  self.prefix = (ddp and o.log_all_ranks) and ("[rank %d] "):format(comm.rank()) or ""
  local opened, why = true, nil
  if self.lead then
    opened, why = pcall(function()
      M.mkdir_p(self.dir, 3) -- (under pcall: the message alone)
      local f, err = io.open(self.metrics_path, "a")
      if not f then error(("train: cannot open %s: %s"):format(self.metrics_path, err), 0) end
      self.file = f
    end)
  end
  if ddp then -- rank 0 alone opens the metrics: the others learn whether it could, and stop with it
    local bad = ddp:reduce_job_numbers({ opened and 0 or 1 })[1]
    if bad > 0 and opened then error("train: rank 0 could not open the metrics file; stopping with it", level) end
  end
  if not opened then error(why, level) end
  return self
end

--- log:record(t): appends t as one JSON line (json_line) and flushes (the
-- lead rank only). A line that cannot be written (a full disk) raises
-- "train: cannot write <file>: <reason>": a run does not go on unrecorded.
function Log:record(t)
  local f = self.file
  if not f then return end
  local ok, err = f:write(M.json_line(t), "\n")
  if ok then ok, err = f:flush() end
  if not ok then error(("train: cannot write %s: %s"):format(self.metrics_path, tostring(err)), 0) end
end

--- log:say(line): prints the line and flushes stdout, unless quiet; on the
-- lead rank only, or under ddp with log_all_ranks on every rank, prefixed
-- "[rank N] ".
function Log:say(line)
  if not self.quiet and (self.lead or (self.ddp and self.log_all_ranks)) then
    print(self.prefix .. line)
    io.stdout:flush()
  end
end

--- log:close() -> true, or nil and the reason the file could not be closed.
function Log:close()
  if not self.file then return true end
  local f = self.file
  self.file = nil
  return f:close()
end

M.Log = Log

return M
