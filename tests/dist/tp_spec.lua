-- tests/dist/tp_spec.lua: lt.dist.tp's region operators and the column- and
-- row-parallel linear layers on every rank of the job (tensor parallelism
-- over the whole world, and over tp=2 groups of a mesh when the world
-- allows), against one process computing the same whole layers on the same
-- inputs: outputs and the gradients of every input and parameter (a
-- rank's shard against the matching slice of the whole gradient), and
-- dropout_rows against one process's mask of the whole tensor.
local lt = require "lutra"
package.path = "tests/dist/?.lua;" .. package.path
local H = require "harness"
local tp = lt.dist.tp

-- the same whole layers and input on every rank (one generator seed)
local function whole(seed, B, T, C, H4)
  local g = lt.Generator(seed)
  local fc = lt.nn.Linear(C, H4, { dtype = "f64", generator = g })
  local proj = lt.nn.Linear(H4, C, { dtype = "f64", generator = g })
  local x = lt.randn({ B, T, C }, { dtype = "f64", generator = g })
  return fc, proj, x
end

local function groups_to_test(w)
  local out = { { "the world", lt.dist.new_group(0, lt.dist.rank()) } }
  if w % 2 == 0 and w > 2 then out[#out + 1] = { "tp=2 of a mesh", lt.dist.mesh { tp = 2 }.tp } end
  return out
end

H.test("column then row parallel MLP equals the whole MLP: output and every gradient", function(_, w)
  for _, case in ipairs(groups_to_test(w)) do
    local name, g = case[1], case[2]
    local n, r = g:size(), g:rank()
    local fc, proj, x = whole(5, 2, 3, 8, 16 * w)
    -- one process's answer
    local xw = x:detach():requires_grad_()
    local want = proj(fc(xw):gelu())
    want:sum():backward()
    -- the split layers from the same weights
    local up, down = tp.ColumnParallelLinear.from(fc, g), tp.RowParallelLinear.from(proj, g)
    assert(up.weight:size(1) == 16 * w / n and down.weight:size(2) == 16 * w / n, name .. ": shard shapes")
    local xt = x:detach():requires_grad_()
    local y = down(up(xt):gelu())
    y:sum():backward()
    H.close(y, want, 1e-12, name .. ": output")
    H.close(xt.grad, xw.grad, 1e-12, name .. ": input gradient (all-reduced by f)")
    local k = 16 * w / n
    H.close(up.weight.grad, fc.weight.grad:narrow(1, r * k + 1, k), 1e-12, name .. ": column weight gradient")
    H.close(up.bias.grad, fc.bias.grad:narrow(1, r * k + 1, k), 1e-12, name .. ": column bias gradient")
    H.close(down.weight.grad, proj.weight.grad:narrow(2, r * k + 1, k), 1e-12, name .. ": row weight gradient")
    H.close(down.bias.grad, proj.bias.grad, 1e-12, name .. ": row bias gradient (added once)")
  end
end)

H.test("gather_output and an input the row layer slices itself", function(_, w)
  local g = lt.dist.new_group(0, lt.dist.rank())
  local fc, proj, x = whole(7, 2, 2, 4, 4 * w)
  local xw = x:detach():requires_grad_()
  local h = fc(xw)
  local want = proj(h)
  want:sum():backward()
  local up = tp.ColumnParallelLinear.from(fc, g, { gather_output = true })
  local down = tp.RowParallelLinear.from(proj, g, { input_is_parallel = false })
  local xt = x:detach():requires_grad_()
  local full = up(xt)
  H.close(full, h, 1e-12, "gathered column output")
  local y = down(full)
  y:sum():backward()
  H.close(y, want, 1e-12, "output")
  H.close(xt.grad, xw.grad, 1e-12, "input gradient")
end)

H.test("dropout_rows: this rank's rows of one process's mask, the generator in step after it", function(_, w)
  for _, case in ipairs(groups_to_test(w)) do
    local name, g = case[1], case[2]
    local n, r = g:size(), g:rank()
    for _, C in ipairs { 8, 5 } do -- (5: a rank's first element off a Philox counter boundary when n > 1)
      local what = ("%s, C %d"):format(name, C)
      local rows = 3
      local x = lt.randn({ rows * n, C }, { dtype = "f64", generator = lt.Generator(2) })
      local ref = lt.Generator(40 + C)
      local want = lt.F.dropout(x, 0.3, { generator = ref })
      local gen = lt.Generator(40 + C)
      local mine = x:narrow(1, r * rows + 1, rows):contiguous():requires_grad_()
      local y = tp.dropout_rows(mine, 0.3, g, { generator = gen })
      H.close(y, want:narrow(1, r * rows + 1, rows), 0, what .. ": rows")
      local rs, gs = ref:state(), gen:state()
      assert(rs.offset == gs.offset and rs.seed == gs.seed, ("%s: generator at offset %d, one process's %d")
        :format(what, gs.offset, rs.offset))
      y:sum():backward() -- (the gradient: the mask scaled, as F.dropout's)
      H.close(mine.grad, want:narrow(1, r * rows + 1, rows):ne(0):to("f64") * (1 / 0.7), 1e-15, what .. ": gradient")
      assert(tp.dropout_rows(mine, 0.3, g, { training = false }) == mine, what .. ": eval is the identity")
    end
  end
  H.raises(function() tp.dropout_rows(lt.zeros(2), 1.5, lt.dist.new_group(0, lt.dist.rank())) end,
    "dropout_rows: p must be in [0, 1], got 1.5")
end)

H.test("sizes that do not divide are refused on every rank, naming the sizes", function(_, w)
  H.raises(function() tp.copy_to_region(lt.zeros(2), "world") end, "expected a process group")
  if w == 1 then return end -- (every size divides by one rank)
  local g = lt.dist.new_group(0, lt.dist.rank())
  local odd = lt.nn.Linear(4, 2 * w + 1, { dtype = "f64" })
  H.raises(function() tp.ColumnParallelLinear.from(odd, g) end, "output features do not divide", tostring(w))
  local odd_in = lt.nn.Linear(2 * w + 1, 4, { dtype = "f64" })
  H.raises(function() tp.RowParallelLinear.from(odd_in, g) end, "input features do not divide", tostring(2 * w + 1))
  H.raises(function() tp.scatter_to_region(lt.zeros(2, 2 * w + 1), g) end, "the last dim", "does not divide")
end)

H.run("tests/dist/tp_spec.lua")
