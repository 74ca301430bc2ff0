-- tests/dist/jobs/recipe_schedule.lua: recipes/gpt2.lua run with its
-- arguments, lutra.dist.pp.executor.new wrapped to print the schedule each
-- pipeline executor is built for ("executor: schedule gpipe"), so that
-- tests/dist/run.sh can check the recipe's --schedule_pp reaches the
-- executor (the schedules train the same numbers: the logged losses
-- cannot tell).
--   mpirun -np 2 ./lutra tests/dist/jobs/recipe_schedule.lua --pp=2 --schedule_pp=gpipe ...
local executor = require "lutra.dist.pp.executor"
local new = executor.new
executor.new = function(model, o)
  io.stdout:write(("executor: schedule %s\n"):format(tostring(o and o.schedule)))
  io.stdout:flush()
  return new(model, o)
end
dofile("recipes/gpt2.lua")
