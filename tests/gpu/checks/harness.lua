-- tests/gpu/checks/harness.lua: what every file of the GPU checks shares
-- (tests/gpu/checks.lua loads them in order): the device under test, the
-- name filter from the command line, check() that runs one check and prints
-- its TAP line, the comparisons close() and pair(), grad_check() (forward
-- and gradients on both devices), and finish() that prints the plan and exits.
local lt = require "lutra"
local F = lt.F

local M = {}

-- LUTRA_CHECK_DEVICE=cpu runs the harness against the CPU itself (to debug
-- it without a GPU); the CUDA-only checks are skipped then.
local CUDA = os.getenv("LUTRA_CHECK_DEVICE") or "cuda"
local on_cuda = CUDA:sub(1, 4) == "cuda"
local ndev, why = lt.cuda.device_count()
if on_cuda and ndev == 0 then
  print(("skipped: no CUDA device (%s)"):format(why or "unknown"))
  os.exit(0)
end
M.CUDA, M.on_cuda, M.ndev = CUDA, on_cuda, ndev

-- name fragments as arguments run only the checks whose names hold one of them
local only = arg and #arg > 0 and arg or nil
local function selected(name)
  if not only then return true end
  for _, fragment in ipairs(only) do
    if name:find(fragment, 1, true) then return true end
  end
  return false
end
-- The CUDA emulator (make emu, tests/emu) runs these checks on the CPU, with
-- its cuDNN stand-in (tests/emu/cudnn.cc: the graphs interpreted) where
-- lutra was built with cuDNN's headers. These checks are one process (one
-- rank); tests/dist/cuda_spec.lua runs NCCL over several.
local EMULATED = on_cuda and lt.build_info():find("CUDA emulator", 1, true) ~= nil
M.EMULATED = EMULATED
local TIMES = os.getenv("LUTRA_CHECK_TIMES") -- print each check's seconds
local tests, failed, matched = 0, 0, 0

-- why cuDNN's checks cannot run on the emulator (nil: they can). On a GPU
-- they always run: a cuDNN that does not load there is a failure.
local function emulator_lacks_cudnn()
  if not EMULATED then return nil end
  local q = lt.zeros({ 1, 1, 8, 8 }, { device = CUDA, dtype = "bf16" })
  local ok, err = pcall(F.scaled_dot_product_attention, q, q, q, { library = true })
  if ok then return nil end
  return tostring(err):match("built without cuDNN[^)]*%)") -- (any other refusal fails the checks)
end
local cudnn_missing = false -- (probed at the first check that needs it)

--- Runs fn as one check. cuda_only: not with LUTRA_CHECK_DEVICE=cpu; needs:
-- "cuDNN" (skipped on an emulator built without cuDNN's headers).
local function check(name, fn, cuda_only, needs)
  if not selected(name) then return end
  matched = matched + 1
  if cuda_only and not on_cuda then return end
  if needs == "cuDNN" then
    if cudnn_missing == false then cudnn_missing = emulator_lacks_cudnn() end
    if cudnn_missing then
      print(("skip - %s (%s)"):format(name, cudnn_missing))
      return
    end
  end
  tests = tests + 1
  local t0 = lt.clock()
  local ok, err = pcall(fn)
  if TIMES then print(("# %.1f s"):format(lt.clock() - t0)) end
  if ok then
    print(("ok %d - %s"):format(tests, name))
  else
    failed = failed + 1
    print(("not ok %d - %s: %s"):format(tests, name, tostring(err):gsub("\n", " | ")))
  end
end
M.check = check

local TOL = { f32 = 1e-5, f64 = 1e-12, bf16 = 1e-2, f16 = 1e-2 }
M.TOL = TOL

--- Asserts that g (any device) matches c (cpu): same shape and dtype, NaN
-- where c has NaN, and max |g - c| <= tol * max(|c|) (1 for an all-zero c).
local function close(g, c, what, tol)
  assert(g.device ~= "cpu" or c.device == "cpu", what .. ": compare a device result to a cpu one")
  local gs, cs = table.concat(g:shape(), "x"), table.concat(c:shape(), "x")
  assert(gs == cs, ("%s: shape %s, cpu %s"):format(what, gs, cs))
  assert(g.dtype == c.dtype, ("%s: dtype %s, cpu %s"):format(what, g.dtype, c.dtype))
  if g:numel() == 0 then return end
  local gc = g:to("cpu")
  if not c:is_floating_point() then
    local diff = (gc:to("f64") - c:to("f64")):abs():max():item()
    assert(diff == 0, ("%s: integer results differ by up to %g"):format(what, diff))
    return
  end
  local g64, c64 = gc:to("f64"), c:to("f64")
  local gnan, cnan = g64:ne(g64), c64:ne(c64)
  assert(gnan:eq(cnan):to("i64"):sum():item() == g:numel(), what .. ": NaN positions differ")
  g64 = g64:masked_fill(gnan, 0)
  c64 = c64:masked_fill(cnan, 0)
  local scale = c64:abs():max():item()
  if scale == 0 or scale ~= scale then scale = 1 end
  local err = (g64 - c64):abs():max():item() / scale
  tol = tol or TOL[c.dtype] or 0
  assert(err <= tol, ("%s: max error %.3g relative to max |cpu| %.3g exceeds %g"):format(what, err, scale, tol))
end
M.close = close

--- The same random tensor on the cpu and on the device.
function M.pair(shape, dtype, opts)
  opts = opts or {}
  local c = lt.randn(shape)
  if opts.positive then c = c:abs() + 0.1 end
  c = c:to(dtype or "f32")
  return c, c:to(CUDA)
end

--- Forward and the gradients of sum(f(inputs) * w) on both devices.
function M.grad_check(name, shapes, f, opts)
  opts = opts or {}
  check(name, function()
    local cins, gins = {}, {}
    for i, s in ipairs(shapes) do
      local c
      if s.ids then c = lt.randint(0, s.ids, s.shape) else c = lt.randn(s.shape):to(s.dtype or "f32") end
      cins[i] = c
      gins[i] = c:to(CUDA)
      if not s.ids and s.grad ~= false then
        cins[i]:requires_grad_()
        gins[i]:requires_grad_()
      end
    end
    local co, go = f(unpack(cins)), f(unpack(gins))
    close(go, co, name .. " output", opts.tol)
    local w = lt.randn(co:shape()):to(co.dtype)
    ;(co * w):sum():backward()
    ;(go * w:to(CUDA)):sum():backward()
    for i, s in ipairs(shapes) do
      if not s.ids and s.grad ~= false then
        close(gins[i].grad, cins[i].grad, ("%s grad %d"):format(name, i), opts.gtol or opts.tol)
      end
    end
  end)
end


--- After the last check: an error when name fragments matched no check,
-- the TAP plan, and the exit status (1 when a check failed).
function M.finish()
  if only and matched == 0 then -- (a misspelt fragment would look like success)
    print(("not ok - no check's name holds any of: %s (fragments match case and all)"):format(table.concat(only, ", ")))
    failed = failed + 1
  end
  print("1.." .. tests)
  os.exit(failed == 0 and 0 or 1)
end

return M
