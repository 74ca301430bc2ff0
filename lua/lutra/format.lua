--- lutra.format: printing tensors as summaries.
-- tostring(t) gives the shape, dtype and device, and the values; a tensor
-- with more than `threshold` elements shows only the first and last `edge`
-- entries of each long dim (torch's print options, defaults 1000 and 3),
-- read through index_select so large tensors are never copied whole.
local core = require "lutra.tensor.core"
local join = require "lutra.tensor.join"

local M = { threshold = 1000, edge = 3, precision = 4 }

local function fmt_number(v, is_int, is_bool, sci)
  if is_bool then return v ~= 0 and "true" or "false" end
  if v ~= v then return "nan" end
  if v == math.huge then return "inf" end
  if v == -math.huge then return "-inf" end
  if is_int then return string.format("%d", v) end
  if sci then return string.format("%." .. M.precision .. "e", v) end
  return string.format("%." .. M.precision .. "f", v)
end

--- The values of t reduced to the edges of each long dim, as nested tables,
-- plus for each dim whether it was cut. The corners are cut out with narrow
-- before anything is copied, so even a huge expanded tensor costs little.
local function summarize(t)
  local cut = {}
  local s = t
  if t:numel() > M.threshold then
    local function corners(x, d)
      if d > x:dim() then return x:contiguous() end
      local n = x:size(d)
      if n <= 2 * M.edge then return corners(x, d + 1) end
      cut[d] = true
      return join.cat({ corners(x:narrow(d, 1, M.edge), d + 1), corners(x:narrow(d, n - M.edge + 1, M.edge), d + 1) }, d)
    end
    s = corners(t, 1)
  end
  if s.device ~= "cpu" then s = s:to("cpu") end
  return s:totable(), cut
end

--- tostring for tensors: "tensor(shape=[2, 3], dtype=f32, device=cpu)" and the values.
function M.tensor(t)
  local header = ("tensor(shape=%s, dtype=%s, device=%s)"):format(
    core.shape_str(t), t.dtype, t.device)
  local ok, vals, cut = pcall(summarize, t)
  if not ok then return header .. " <values unavailable: " .. tostring(vals) .. ">" end
  local dt = t.dtype
  local is_bool = dt == "bool"
  local is_int = not is_bool and not t:is_floating_point()
  -- one number style for the whole tensor: fixed, or scientific for extreme magnitudes
  local maxabs, minabs = 0, math.huge
  local function scan(x)
    if type(x) == "table" then
      for i = 1, #x do scan(x[i]) end
    elseif type(x) == "number" and x == x and math.abs(x) ~= math.huge then
      local a = math.abs(x)
      if a > maxabs then maxabs = a end
      if a > 0 and a < minabs then minabs = a end
    end
  end
  scan(vals)
  local sci = not is_int and (maxabs >= 1e6 or (minabs < 1e-3 and minabs ~= math.huge))
  local width = 0
  local function measure(x)
    if type(x) == "table" then
      for i = 1, #x do measure(x[i]) end
    else
      local s = fmt_number(type(x) == "boolean" and (x and 1 or 0) or x, is_int, is_bool, sci)
      if #s > width then width = #s end
    end
  end
  measure(vals)
  local function render(x, d, indent)
    if type(x) ~= "table" then
      local s = fmt_number(type(x) == "boolean" and (x and 1 or 0) or x, is_int, is_bool, sci)
      return string.rep(" ", width - #s) .. s
    end
    local parts = {}
    for i = 1, #x do
      if cut[d] and i == M.edge + 1 then parts[#parts + 1] = "..." end
      parts[#parts + 1] = render(x[i], d + 1, indent .. " ")
    end
    if type(x[1]) == "table" then
      local sep = ",\n" .. string.rep("\n", math.max(0, t:dim() - d - 1)) .. indent .. " "
      return "[" .. table.concat(parts, sep) .. "]"
    end
    return "[" .. table.concat(parts, ", ") .. "]"
  end
  if type(vals) ~= "table" then
    return header .. "\n" .. render(vals, 1, "")
  end
  return header .. "\n" .. render(vals, 1, "")
end

return M
