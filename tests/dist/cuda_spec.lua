-- tests/dist/cuda_spec.lua: lt.dist on CUDA tensors, one device per rank
-- (NCCL), three ways:
--   1. the collectives of collectives_spec that NCCL has (all_reduce
--      sum/avg/max/min in f32, f64, bf16, f16, i64, i32, u8; async;
--      broadcast from every root; all_gather and reduce_scatter of equal
--      chunks; tensors larger than the CUDA emulator's exchange slot, so
--      they go in pieces) against the same collectives on CPU tensors
--      (MPI): bitwise on 2 ranks, where a sum has one addition; on more,
--      NCCL's order of the sum (rank order on the emulator, a ring on a GPU)
--      may differ from MPI's: within 1e-6 of the largest value (f32; bf16
--      and f16, rounded at each addition by NCCL and once by MPI: 2^-8).
--      Every rank's result is checked to be bitwise every other's;
--   2. lt.dist.tp's layers (the column-GELU-row MLP, plain and sequence
--      parallel, over the world and over tp=2 groups of a mesh;
--      gather_output) in f64 on CUDA against one process computing the
--      whole layers on the CPU: outputs and every gradient within 1e-12;
--   3. DataParallel and ZeRO-3 training gpt2-tiny on CUDA (2 f32 AdamW
--      steps) against one process on CUDA on the global batch: losses
--      within 1e-5 relative, weights 1e-4; and a pipeline (pp = 2, dp =
--      world / 2; activations staged through the CPU) the same way.
--
-- Runs where lutra has a CUDA device per rank: on the CUDA emulator
-- (build-emu/lutra, one emulated device per process; tests/run.sh runs it
-- on 2 and 4 ranks), or on a node with a GPU per rank; elsewhere it says
-- why it skips.
local lt = require "lutra"
package.path = "tests/dist/?.lua;" .. package.path
local H = require "harness"
local tp = lt.dist.tp

local rank, world = lt.dist.init()
local ndev, why = lt.cuda.device_count()
local emulated = lt.build_info():find("CUDA emulator", 1, true) ~= nil
local skip
if ndev == 0 then
  skip = ("no CUDA device (%s)"):format(why or "unknown")
elseif not emulated and ndev < world then
  -- (NCCL refuses two ranks of a communicator on one GPU; ranks on one node share its devices)
  skip = ("%d CUDA device%s for %d ranks: NCCL needs a device per rank"):format(ndev, ndev == 1 and "" or "s", world)
end
if skip then
  if rank == 0 then print("# skipped: " .. skip) end
  H.run("tests/dist/cuda_spec.lua")
  return
end
local CUDA = lt.dist.device()

-- rank r's tensor: values r + 1 + k/10 for k = 0..n-1 (distinct per rank)
local function mine(r, n, dtype)
  return (lt.arange(n):to("f64") / 10 + (r + 1)):to(dtype or "f32")
end

-- every rank's t (a CPU tensor) is bitwise the same
local function same_everywhere(t, what)
  local all = lt.dist.all_gather(t:contiguous():view(1, -1))
  for q = 1, world - 1 do
    H.close(all:narrow(1, q + 1, 1), all:narrow(1, 1, 1), 0, what .. ": rank " .. q .. " against rank 0")
  end
end

-- a collective on CUDA (got, on the CPU again) against the same on the CPU
-- (want): bitwise where no order of a sum can differ, else within rel of
-- the largest value; and the same on every rank, unless each rank's is its own
local function against(got, want, what, summed, rel, own)
  assert(got.device == "cpu" and got.dtype == want.dtype, what .. ": " .. got.dtype)
  local tol = 0
  if summed and world > 2 then tol = (rel or 1e-6) * want:to("f64"):abs():max():item() end
  H.close(got, want, tol, what)
  if not own then same_everywhere(got, what) end
end

H.test("all_reduce sum, avg, max, min on CUDA equals MPI's on the CPU: f32, f64, bf16, f16, i64, i32, u8", function(r, w)
  for _, dt in ipairs { "f32", "f64", "bf16", "f16" } do
    for _, op in ipairs { "sum", "avg", "max", "min" } do
      local c, g = mine(r, 7, dt), mine(r, 7, dt):to(CUDA)
      lt.dist.all_reduce(c, { op = op })
      lt.dist.all_reduce(g, { op = op })
      local summed = op == "sum" or op == "avg"
      against(g:to("cpu"), c, dt .. " " .. op, summed, (dt == "bf16" or dt == "f16") and 2 ^ -8 or 1e-6)
    end
  end
  for _, dt in ipairs { "i64", "i32" } do
    for _, op in ipairs { "sum", "max", "min" } do
      local c = lt.full({ 3 }, (dt == "i64" and 2 ^ 40 or 2 ^ 20) + r, { dtype = dt })
      local g = c:to(CUDA)
      lt.dist.all_reduce(c, { op = op })
      lt.dist.all_reduce(g, { op = op })
      against(g:to("cpu"), c, dt .. " " .. op) -- (integers: exact in any order)
    end
  end
  local c = lt.full({ 4 }, 3 + r, { dtype = "u8" })
  local g = c:to(CUDA)
  lt.dist.all_reduce(c, { op = "max" })
  lt.dist.all_reduce(g, { op = "max" })
  against(g:to("cpu"), c, "u8 max")
end)

H.test("asynchronous all_reduce on CUDA: the handle's wait gives the result", function(r, w)
  local a, b = mine(r, 1000):to(CUDA), mine(r, 13):to(CUDA)
  local ha = lt.dist.all_reduce(a, { async = true })
  local hb = lt.dist.all_reduce(b, { async = true, op = "max" })
  assert(hb:wait() == b and ha:wait() == a)
  local want = mine(r, 1000)
  lt.dist.all_reduce(want)
  against(a:to("cpu"), want, "async sum", true)
  against(b:to("cpu"), mine(w - 1, 13), "async max")
end)

H.test("broadcast on CUDA from every root, f64 and bf16", function(r, w)
  for root = 0, w - 1 do
    for _, dt in ipairs { "f64", "bf16" } do
      local g = mine(r, 9, dt):to(CUDA)
      lt.dist.broadcast(g, { src = root })
      against(g:to("cpu"), mine(root, 9, dt), dt .. " from " .. root)
    end
  end
end)

H.test("all_gather and reduce_scatter of equal chunks on CUDA equal MPI's on the CPU", function(r, w)
  for _, dt in ipairs { "f32", "i64" } do
    local c = (lt.full({ 2, 3 }, r) + lt.arange(6):view(2, 3)):to(dt)
    against(lt.dist.all_gather(c:to(CUDA)):to("cpu"), lt.dist.all_gather(c), dt .. " all_gather")
  end
  for _, rows in ipairs { w, 3 * w } do
    local full = mine(r, rows * 2):view(rows, 2) * (r + 1)
    for _, op in ipairs { "sum", "avg", "max" } do
      local want = lt.dist.reduce_scatter(full, { op = op })
      local got = lt.dist.reduce_scatter(full:to(CUDA), { op = op }):to("cpu")
      assert(got:size(1) == rows / w, ("rows %d: %d rows back"):format(rows, got:size(1)))
      against(got, want, ("reduce_scatter %s of %d rows"):format(op, rows), op ~= "max", nil, true)
    end
  end
end)

H.test("tensors larger than the emulator's exchange slot (1 MiB a rank) go in pieces", function(r, w)
  local n = 2 ^ 18 + 13 -- (f32: 13 elements past 1 MiB)
  local c = mine(r, n)
  local g = c:to(CUDA)
  lt.dist.all_reduce(c)
  lt.dist.all_reduce(g)
  against(g:to("cpu"), c, "all_reduce of " .. n, true)
  local rows = w * (2 ^ 17 + 5) -- (reduce_scatter: each rank's piece of every rank's rows)
  local full = mine(r, rows):view(rows, 1)
  against(lt.dist.reduce_scatter(full:to(CUDA)):to("cpu"), lt.dist.reduce_scatter(full), "reduce_scatter of " .. rows,
    true, nil, true)
  local part = mine(r, n):view(n, 1)
  against(lt.dist.all_gather(part:to(CUDA)):to("cpu"), lt.dist.all_gather(part), "all_gather of " .. n)
end)

-- the whole layers and input, the same on every rank (one generator seed),
-- on the CPU; on_cuda: the layers moved to this rank's device
local function whole(seed, B, T, C, H4, on_cuda)
  local g = lt.Generator(seed)
  local fc = lt.nn.Linear(C, H4, { dtype = "f64", generator = g })
  local proj = lt.nn.Linear(H4, C, { dtype = "f64", generator = g })
  local x = lt.randn({ B, T, C }, { dtype = "f64", generator = g })
  if on_cuda then fc:to(CUDA); proj:to(CUDA) end
  return fc, proj, x
end

local function groups_to_test(w)
  local out = { { "the world", lt.dist.new_group(0, lt.dist.rank()) } }
  if w % 2 == 0 and w > 2 then out[#out + 1] = { "tp=2 of a mesh", lt.dist.mesh { tp = 2 }.tp } end
  return out
end

-- f64 on both devices: the CUDA products (cuBLASLt; on the emulator
-- OpenBLAS in f64) and the shards' partial sums differ from the CPU's only
-- in their order
local TOL = 1e-12

H.test("column then row parallel MLP on CUDA equals the whole MLP on the CPU: output and every gradient",
  function(_, w)
  for _, sp in ipairs { false, true } do
    for _, case in ipairs(groups_to_test(w)) do
      local name, g = case[1] .. (sp and ", sequence parallel" or ""), case[2]
      local n, r = g:size(), g:rank()
      local B, T, C = 2, 2 * n, 8
      local fc, proj, x = whole(5, B, T, C, 16 * n)
      local xw = x:detach():requires_grad_()
      local want = proj(fc(xw):gelu())
      want:sum():backward()
      local cfc, cproj = whole(5, B, T, C, 16 * n, true)
      local up = tp.ColumnParallelLinear.from(cfc, g, { sequence_parallel = sp })
      local down = tp.RowParallelLinear.from(cproj, g, { sequence_parallel = sp })
      local k = 16
      assert(up.weight.device == CUDA and up.weight:size(1) == k and down.weight:size(2) == k, name .. ": shards")
      -- sequence parallel: this rank's rows of the tokens in, its rows of the output out
      local rows = B * T / n
      local xin = sp and x:view(B * T, C):narrow(1, r * rows + 1, rows) or x
      local xt = xin:to(CUDA):detach():requires_grad_()
      local y = down(up(xt):gelu())
      y:sum():backward()
      local y_want = sp and want:view(B * T, C):narrow(1, r * rows + 1, rows) or want
      local dx_want = sp and xw.grad:view(B * T, C):narrow(1, r * rows + 1, rows) or xw.grad
      H.close(y:to("cpu"), y_want, TOL, name .. ": output")
      H.close(xt.grad:to("cpu"), dx_want, TOL, name .. ": input gradient")
      H.close(up.weight.grad:to("cpu"), fc.weight.grad:narrow(1, r * k + 1, k), TOL, name .. ": column weight gradient")
      H.close(up.bias.grad:to("cpu"), fc.bias.grad:narrow(1, r * k + 1, k), TOL, name .. ": column bias gradient")
      H.close(down.weight.grad:to("cpu"), proj.weight.grad:narrow(2, r * k + 1, k), TOL, name .. ": row weight gradient")
      H.close(down.bias.grad:to("cpu"), proj.bias.grad, TOL, name .. ": row bias gradient (added once)")
      same_everywhere(down.bias.grad:to("cpu"), name .. ": the replicated bias's gradient")
    end
  end
end)

H.test("gather_output and an input the row layer slices itself, on CUDA", function(_, w)
  local g = lt.dist.new_group(0, lt.dist.rank())
  local fc, proj, x = whole(7, 2, 2, 4, 4 * w)
  local xw = x:detach():requires_grad_()
  local h = fc(xw)
  local want = proj(h)
  want:sum():backward()
  local cfc, cproj = whole(7, 2, 2, 4, 4 * w, true)
  local up = tp.ColumnParallelLinear.from(cfc, g, { gather_output = true })
  local down = tp.RowParallelLinear.from(cproj, g, { input_is_parallel = false })
  local xt = x:to(CUDA):detach():requires_grad_()
  local full = up(xt)
  H.close(full:to("cpu"), h, TOL, "gathered column output")
  local y = down(full)
  y:sum():backward()
  H.close(y:to("cpu"), want, TOL, "output")
  H.close(xt.grad:to("cpu"), xw.grad, TOL, "input gradient")
end)

-- ---- data parallelism on CUDA: buckets all-reduced during backward, ZeRO-3's shards --------

local STEPS, B, T = 2, 2, 8

-- this rank's slice of the global batches (slice nil: all of them), the same on every rank
local function batches(w, slice)
  local g = lt.Generator(77)
  local out = {}
  for i = 1, STEPS do
    local ids = lt.randint(0, 512, { B * w, T + 1 }, { generator = g })
    if slice then ids = ids:narrow(1, slice * B + 1, B) end
    out[i] = { ids:narrow(2, 1, T):contiguous(), ids:narrow(2, 2, T):contiguous() }
  end
  return H.loader(out)
end

-- STEPS AdamW steps of gpt2-tiny on CUDA; stage nil: one process on the whole global batch
local function train_cuda(stage, r, w)
  local model = lt.models.gpt2("gpt2-tiny", { generator = lt.Generator(5) }):to(CUDA)
  local settings = { lr = 3e-3, betas = { 0.9, 0.95 }, weight_decay = 0.1 }
  local ddp, opt
  if stage == nil then
    opt = lt.optim.AdamW(model, settings)
  else
    ddp = lt.dist.DataParallel(model, { gradients = stage >= 2 and "none" or "all_reduce", bucket_mb = 0.05 })
    if stage == 0 then opt = lt.optim.AdamW(model, settings) else
      settings.stage = stage
      opt = lt.dist.Zero(model, settings)
    end
  end
  local losses = {}
  lt.train { model = model, optimizer = opt, train = batches(w, stage and r), steps = STEPS, clip = 0.5, quiet = true,
    out_dir = os.tmpname() .. "-cuda", ddp = ddp, on_step = function(rec) losses[rec.step] = rec.loss end }
  if opt.unshard then opt:unshard() end
  return model, losses
end

H.test("DataParallel and ZeRO-3 on CUDA match one process on the global batch (2 f32 AdamW steps)", function(r, w)
  local ref, ref_losses = train_cuda(nil, r, w)
  for _, stage in ipairs { 0, 3 } do
    local model, losses = train_cuda(stage, r, w)
    local what = stage == 0 and "DataParallel" or "ZeRO-3"
    for s = 1, STEPS do
      local rel = math.abs(losses[s] - ref_losses[s]) / math.abs(ref_losses[s])
      assert(rel < 1e-5, ("%s step %d: loss %.8f vs one process %.8f"):format(what, s, losses[s], ref_losses[s]))
    end
    local a, b = model:parameters(), ref:parameters()
    for i = 1, #a do H.close(a[i]:to("cpu"), b[i]:to("cpu"), 1e-4, what .. ": parameter " .. i) end
    same_everywhere(a[1]:to("cpu"):view(-1), what .. ": the first parameter")
  end
end)

H.test("GPT-2 and Llama split over every rank on CUDA (lt.models.*{tp =}): the whole model's loss, logits and gradients on the CPU (f64, with and without SP)", function(_, w)
  local g = lt.dist.new_group(0, lt.dist.rank())
  local gen = lt.Generator(21)
  local ids = lt.randint(0, 97, { 2, 9 }, { generator = gen }):to("i64")
  local x, y = ids:narrow(2, 1, 8):contiguous(), ids:narrow(2, 2, 8):contiguous()
  for _, family in ipairs { "gpt2", "llama" } do
    for _, sp in ipairs { false, true } do
      local what = ("%s tp=%d%s on CUDA"):format(family, w, sp and " SP" or "")
      local make = family == "gpt2" and lt.models.gpt2 or lt.models.llama
      local name = family == "gpt2" and "gpt2-tiny" or "llama-tiny"
      local whole = make(name, { vocab_size = 97, dtype = "f64", generator = lt.Generator(4) })
      local par = make(name, { vocab_size = 97, dtype = "f64", generator = lt.Generator(4), tp = g,
        sequence_parallel = sp })
      par:to(CUDA)
      local lw = whole:loss(x, y)
      lw:backward()
      local lp = par:loss(x:to(CUDA), y:to(CUDA))
      lp:backward()
      assert(math.abs(lp:item() - lw:item()) <= 1e-12 * math.abs(lw:item()), what .. ": loss")
      H.close(par(x:to(CUDA)):to("cpu"), whole(x), 1e-10, what .. ": logits")
      local plan, wp = tp.plan(par), {}
      for _, np in ipairs(whole:named_parameters()) do wp[np[1]] = np[2] end
      for _, np in ipairs(par:named_parameters()) do
        local p, rec, full = np[2], plan[np[1]], wp[np[1]].grad
        assert(p.device == CUDA, what .. ": " .. np[1] .. " on " .. p.device)
        if rec and rec.dim == 1 and full:size(1) ~= p:size(1) * w then -- (the padded vocabulary's zero rows)
          local z = lt.zeros({ p:size(1) * w, full:size(2) }, { dtype = "f64" })
          z:narrow(1, 1, full:size(1)):copy_(full)
          full = z
        end
        if rec then full = tp.shard(full, rec.dim, g, "test", "%d", rec.parts) end
        H.close(p.grad:to("cpu"), full, 1e-10, what .. ": gradient of " .. np[1])
      end
    end
  end
end)

H.test("pipeline stages on CUDA (pp = 2, 1F1B, 4 micro-batches; dp = world / 2) match one process on CUDA", function(r, w)
  if w % 2 ~= 0 then return end
  local mesh = lt.dist.mesh { pp = 2 }
  local dp = w / 2
  local function gpt2(pp)
    return lt.models.gpt2("gpt2-tiny", { n_layer = 4, generator = lt.Generator(5), pp = pp, device = CUDA })
  end
  local g = lt.Generator(78)
  local data = {}
  for i = 1, 3 * 4 do
    local ids = lt.randint(0, 512, { B * dp, T + 1 }, { generator = g })
    data[i] = { ids:narrow(2, 1, T):contiguous(), ids:narrow(2, 2, T):contiguous() }
  end
  local function run(model, first, count, ddp)
    local opt = lt.optim.AdamW(model:parameters(), { lr = 3e-3, weight_decay = 0.1 })
    local S = lt.train.step.new { model = model, optimizer = opt, accum = 4, clip = 0.5, ddp = ddp }
    local i, losses = 0, {}
    for s = 1, 3 do
      losses[s] = S:run(s, function()
        i = i + 1
        return data[i][1]:narrow(1, first, count):contiguous(), data[i][2]:narrow(1, first, count):contiguous()
      end).loss
    end
    return losses
  end
  local ref = run(gpt2(nil), 1, B * dp)
  local model = gpt2(mesh.pp)
  local ddp = dp > 1 and lt.dist.DataParallel(model, { group = mesh.dp }) or nil
  local got = run(model, mesh.coords.dp * B + 1, B, ddp)
  for s = 1, 3 do
    local rel = math.abs(got[s] - ref[s]) / math.abs(ref[s])
    assert(rel < 1e-5, ("step %d: the pipeline's loss %.8f vs one process %.8f"):format(s, got[s], ref[s]))
  end
end)

H.run("tests/dist/cuda_spec.lua")
