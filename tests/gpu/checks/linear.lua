-- tests/gpu/checks/linear.lua: F.linear and F.mlp on cuda against the cpu,
-- forward and gradients, through cuBLASLt's epilogues (BIAS, GELU_AUX,
-- DGELU, DGELU_BGRAD) and composed where they do not apply or are refused
-- (LUTRA_EMU_REFUSE_EPILOGUES on the emulator), with the profile's names.

local lt = require "lutra"
local C = require "tests.gpu.checks.harness"
local F = lt.F
local CUDA = C.CUDA
local check, close, grad_check = C.check, C.close, C.grad_check

grad_check("linear (8, 128, 768) -> 2304", { { shape = { 8, 128, 768 } }, { shape = { 2304, 768 } }, { shape = { 2304 } } },
  function(x, w, b) return F.linear(x, w, b) end, { gtol = 1e-4 })
-- cuBLASLt epilogues: the bias, and the GELU with its input kept for the backward
grad_check("linear with GELU (8, 128, 768) -> 3072 in bf16 (epilogue GELU_AUX_BIAS)", { { shape = { 8, 128, 768 },
  dtype = "bf16" }, { shape = { 3072, 768 }, dtype = "bf16" }, { shape = { 3072 }, dtype = "bf16" } },
  function(x, w, b) return F.linear(x, w, b, { activation = "gelu" }) end, { tol = 2e-2, gtol = 2e-2 })
grad_check("linear with GELU, no bias, f32 (epilogue GELU_AUX)", { { shape = { 256, 64 } }, { shape = { 128, 64 } } },
  function(x, w) return F.linear(x, w, nil, { activation = "gelu" }) end, { gtol = 1e-4 })
grad_check("linear (1024, 768) -> 768 in bf16 (epilogue BIAS)", { { shape = { 1024, 768 }, dtype = "bf16" },
  { shape = { 768, 768 }, dtype = "bf16" }, { shape = { 768 }, dtype = "bf16" } },
  function(x, w, b) return F.linear(x, w, b) end, { tol = 2e-2, gtol = 2e-2 })
-- GPT-2's MLP as one op: the GELU's gradient and the first bias's inside the
-- product that makes the hidden gradient (DGELU_BGRAD), DGELU without it
grad_check("linear pair as one MLP (F.mlp) (4, 128, 768) -> 3072 -> 768 in bf16 (epilogue DGELU_BGRAD)", {
  { shape = { 4, 128, 768 }, dtype = "bf16" }, { shape = { 3072, 768 }, dtype = "bf16" }, { shape = { 3072 }, dtype = "bf16" },
  { shape = { 768, 3072 }, dtype = "bf16" }, { shape = { 768 }, dtype = "bf16" } },
  function(x, w1, b1, w2, b2) return F.mlp(x, w1, b1, w2, b2) end, { tol = 2e-2, gtol = 2e-2 })
grad_check("linear pair as one MLP, f32, no first bias (epilogue DGELU)", { { shape = { 256, 64 } }, { shape = { 128, 64 } },
  { shape = { 32, 128 } }, { shape = { 32 } } }, function(x, w1, w2, b2) return F.mlp(x, w1, nil, w2, b2) end,
  { gtol = 1e-4 })
grad_check("linear pair as one MLP, f32, hidden 100 (aux rows not a multiple of 8: composed)", { { shape = { 96, 48 } },
  { shape = { 100, 48 } }, { shape = { 100 } }, { shape = { 40, 100 } } },
  function(x, w1, b1, w2) return F.mlp(x, w1, b1, w2, nil) end, { gtol = 1e-4 })
check("linear pair as one MLP: the backward's products carry the GELU's gradient (profile names)", function()
  local x = lt.randn({ 64, 32 }, { device = CUDA }):requires_grad_()
  local w1 = lt.randn({ 64, 32 }, { device = CUDA }):requires_grad_()
  local b1 = lt.randn({ 64 }, { device = CUDA }):requires_grad_()
  local w2 = lt.randn({ 16, 64 }, { device = CUDA }):requires_grad_()
  local y = F.mlp(x, w1, b1, w2, nil)
  assert(y.grad_fn == "MlpBackward", y.grad_fn)
  local wy = lt.randn({ 64, 16 }, { device = CUDA }) -- (a gradient with unit-stride rows; sum()'s is expanded)
  lt.cuda.synchronize()
  lt.cuda.profile_start()
  ;(y * wy):sum():backward()
  local prof = lt.cuda.profile_stop()
  local names = {}
  for _, r in ipairs(prof.rows) do names[#names + 1] = r.name end
  names = table.concat(names, "; ")
  if os.getenv("LUTRA_EMU_REFUSE_EPILOGUES") then
    assert(not names:find("dgelu", 1, true), "refused epilogues compose: " .. names)
  else
    assert(names:find("cuBLASLt f32 64x64x16 dgelu bgrad", 1, true), "g1 and db1 in one product: " .. names)
  end
  -- only the input takes a gradient: DGELU without the bias gradient
  local x2 = x:detach():requires_grad_()
  local y2 = F.mlp(x2, w1:detach(), b1:detach(), w2:detach(), nil)
  lt.cuda.profile_start()
  ;(y2 * wy):sum():backward()
  names = {}
  for _, r in ipairs(lt.cuda.profile_stop().rows) do names[#names + 1] = r.name end
  names = table.concat(names, "; ")
  assert(os.getenv("LUTRA_EMU_REFUSE_EPILOGUES") or names:find("64x64x16 dgelu;", 1, true)
    or names:find("64x64x16 dgelu$"), "the GELU's gradient alone: " .. names)
  close(x2.grad, x.grad:to("cpu"), "the input's gradient either way", 1e-5)
end, true)
