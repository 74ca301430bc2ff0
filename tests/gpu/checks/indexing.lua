-- tests/gpu/checks/indexing.lua: gather (with reductions and gradients) and
-- scatter_add_ with repeated indices on cuda, bit for bit the CPU's sums,
-- and a bad index among many lines named.

local lt = require "lutra"
local C = require "tests.gpu.checks.harness"
local CUDA = C.CUDA
local check, grad_check = C.check, C.grad_check

grad_check("gather and reductions with gradients", { { shape = { 64, 100 } } }, function(x)
  local v = {}
  for i = 1, 64 * 5 do v[i] = (i * 13) % 100 end
  local idx = lt.tensor(v, { dtype = "i64", device = x.device }):reshape(64, 5)
  return x:gather(2, idx):sum(2) + x:max(2) + x:var(2)
end)

check("scatter_add_ with repeated indices, rows in parallel: bit for bit the CPU's sequential sums", function()
  local gen = lt.Generator(11)
  for _, case in ipairs({ { dim = 2, dtype = "f32" }, { dim = 1, dtype = "bf16" }, { dim = 2, dtype = "i32" } }) do
    -- 300 x 40 targets; 700 source elements per line along dim, indices in 0..39 (each target ~17 times)
    local tshape = case.dim == 2 and { 300, 40 } or { 40, 300 }
    local sshape = case.dim == 2 and { 300, 700 } or { 700, 300 }
    local idx = lt.randint(0, 40, sshape, { generator = gen })
    local src = lt.randn(sshape, { generator = gen }) * 100
    if case.dtype == "i32" then src = src:to("i32") else src = src:to(case.dtype) end
    local base = lt.randn(tshape, { generator = gen }):to(case.dtype)
    -- a non-contiguous target: the transpose of a contiguous buffer
    local c = base:t():contiguous():t()
    c:scatter_add_(case.dim, idx, src)
    local g = base:t():contiguous():to(CUDA):t()
    g:scatter_add_(case.dim, idx:to(CUDA), src:to(CUDA))
    local d = (g:to("cpu"):to("f64") - c:to("f64")):abs():max():item()
    assert(d == 0, ("scatter_add_ dim %d %s: differs from the CPU by up to %g"):format(case.dim, case.dtype, d))
  end
  -- a bad index among many lines is still reported, naming the op
  local t = lt.zeros({ 100, 8 }, { device = CUDA })
  local v = {}
  for i = 1, 300 do v[i] = i == 170 and 8 or i % 8 end
  local bad = lt.tensor(v, { dtype = "i64" }):reshape(100, 3)
  local ok, err = pcall(function() t:scatter_add_(2, bad:to(CUDA), lt.ones({ 100, 3 }, { device = CUDA })) end)
  assert(not ok and tostring(err):find("scatter_add_", 1, true), "bad index: " .. tostring(err))
end)
