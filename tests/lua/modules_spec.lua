-- tests/lua/modules_spec.lua: the Lua library's module graph. Every module
-- of lua/lutra loads on its own in a fresh lutra process (a cycle in the
-- graph fails there: Lua's require reports the loop), without the umbrella
-- "lutra" (which only assembles the public lt table from the others), and
-- every require sits at the top level of its module (none inside a
-- function to break a loop at run time).
local sh = require("tests.lua.helpers").sh

-- module names from the files: lua/lutra/nn/init.lua -> lutra.nn
local function modules()
  local p = assert(io.popen("find lua/lutra -name '*.lua' | sort"))
  local out = {}
  for path in p:lines() do
    local name = path:gsub("^lua/", ""):gsub("%.lua$", ""):gsub("/init$", ""):gsub("/", ".")
    out[#out + 1] = { name = name, path = path }
  end
  p:close()
  return out
end

-- a script run as a file (-e would load the umbrella for lt): requires one
-- module with `require` wrapped to refuse "lutra", then checks that the
-- umbrella was not loaded some other way
local probe = [[
local name = ...
local real = require
rawset(_G, "require", function(m)
  if m == "lutra" then error(name .. " requires the umbrella \"lutra\"", 2) end
  return real(m)
end)
real(name)
if package.loaded["lutra"] ~= nil then error(name .. " loaded the umbrella \"lutra\"") end
print("loaded " .. name)
]]

describe("the Lua library's modules", function()
  local list = modules()
  it("are found", function()
    assert.truthy(#list >= 30, #list)
  end)
  it("each load on their own, without the umbrella and without cycles", function()
    local f = os.tmpname()
    local h = assert(io.open(f, "w"))
    h:write(probe)
    h:close()
    local bad = {}
    for _, m in ipairs(list) do
      if m.name ~= "lutra" then
        local out, rc = sh(("./lutra %s %s 2>&1"):format(f, m.name))
        if rc ~= 0 or not out:find("loaded " .. m.name, 1, true) then bad[#bad + 1] = m.name .. ": " .. out end
      end
    end
    os.remove(f)
    assert.are.equal("", table.concat(bad, "\n"))
  end)
  it("require at their top level only", function()
    local bad = {}
    for _, m in ipairs(list) do
      local n = 0
      for line in io.lines(m.path) do
        n = n + 1
        local code = line:gsub("%-%-.*$", "")
        if code:find("^%s+") and code:find("require%s*[%(\"']") then
          bad[#bad + 1] = ("%s:%d: %s"):format(m.path, n, line)
        end
      end
    end
    assert.are.equal("", table.concat(bad, "\n"))
  end)
  it("the umbrella gives the same lt as the modules do", function()
    local lt = require "lutra"
    assert.are.equal(require "lutra.dist", lt.dist)
    assert.are.equal(require "lutra.optim", lt.optim)
    assert.are.equal(require "lutra.train", lt.train)
    assert.are.equal(require("lutra.tensor").zeros, lt.zeros)
  end)
end)
