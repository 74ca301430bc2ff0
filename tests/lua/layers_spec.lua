--- tests/lua/layers_spec.lua: the source tree keeps its layers
-- (ARCHITECTURE.md): tools/check_layers.lua on this tree and this build
-- finds nothing, and it does find each kind of break in a small tree made to
-- break them.
local H = require "tests.lua.helpers"

-- the lutra running these specs and its build's objects: ./lutra is
-- build/'s, build-asan/lutra build-asan/'s (make asan runs the specs so)
local function this_lutra()
  local exe = io.popen("readlink -f /proc/$PPID/exe 2>/dev/null"):read("*l") or ""
  local root = io.popen("pwd -P"):read("*l")
  local dir = exe:match("^(.*)/lutra$")
  if not dir then return "./lutra", "build" end
  if dir == root then return "./lutra", "build" end
  local rel = dir:sub(#root + 2)
  return rel .. "/lutra", rel
end

describe("the layers of the source tree", function()
  it("tools/check_layers.lua: every include and call goes down a layer, no switch or file out of place", function()
    local bin, build = this_lutra()
    local out, rc = H.sh(("%s tools/check_layers.lua --build=%s"):format(bin, build))
    assert.are.equal(0, rc, out)
    assert.truthy(out:find("check_layers: ok"), out)
  end)

  it("reports an upward include (in a file not yet added too), a kernel seeing the host, a stray switch and a long file", function()
    local dir = io.popen("mktemp -d"):read("*l")
    finally(function() os.execute("rm -rf " .. dir) end)
    local function write(path, text)
      os.execute(("mkdir -p %s/%s"):format(dir, path:match("^(.*)/") or "."))
      local f = assert(io.open(dir .. "/" .. path, "w"))
      f:write(text)
      f:close()
    end
    write("host/core/a.c", '#include "ops/b.h"\nint a;\n')
    write("host/ops/b.h", "int b;\n")
    write("kernels/cpu/k.c", '#include "../../host/core/t.h"\n')
    write("host/core/t.h", "struct t;\n")
    write("host/cuda/e.c", "#ifdef LT_CUDA_EMU\n#endif\n#if defined(LT_WITH_MPI)\n#endif\n")
    write("host/io/long.c", ("x;\n"):rep(801))
    assert.are.equal(0, select(2, H.sh(("cd %s && git init -q . && git add -A"):format(dir))))
    write("host/base/new.c", '#include "core/t.h"\n') -- (untracked: a new file counts before it is added)
    local out, rc = H.sh(("./lutra tools/check_layers.lua --root=%s --no-objects"):format(dir))
    assert.are.equal(1, rc, out)
    assert.truthy(out:find("core uses ops, a layer not below it: host/core/a.c includes host/ops/b.h", 1, true), out)
    assert.truthy(out:find("kernels/cpu/k.c:1: a kernel includes the host's host/core/t.h", 1, true), out)
    assert.truthy(out:find("host/cuda/e.c:1: an LT_CUDA_EMU conditional", 1, true), out)
    assert.truthy(out:find("host/cuda/e.c:3: an LT_WITH_MPI conditional", 1, true), out)
    assert.truthy(out:find("host/io/long.c: 801 lines", 1, true), out)
    assert.truthy(out:find("base uses core, a layer not below it: host/base/new.c includes host/core/t.h", 1, true), out)
  end)
end)
