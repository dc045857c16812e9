-- Argo CD health check for switchyard.dev/TrafficRoute.
--
-- Argo CD runs this with the live object in `obj` and reads the returned table:
-- hs.status (Healthy, Progressing, Degraded, Suspended, Missing) and hs.message.
-- Written for Lua 5.1 (Argo CD's interpreter): no goto, no integer division, no bit ops.
--
--   Healthy      Switchyard observed this generation and the Ready condition is True.
--   Progressing  no status yet; this generation not observed yet; no Ready condition for
--                it yet; Ready is Unknown; or Ready is False because a rollout is under
--                way (reason Staging, VerifyingEndpoints, Promoting, VerifyingLive,
--                Draining, Progressing).
--   Degraded     Ready is False for any other reason (ServiceNotFound, PortNotFound,
--                InvalidSpec, Rejected, EnvoyRejected, ProbeDeadlineExceeded, ...).

local rollout_reasons = {
  Staging = true,
  VerifyingEndpoints = true,
  Promoting = true,
  VerifyingLive = true,
  Draining = true,
  Progressing = true,
}

local function number(value)
  if type(value) == "number" then
    return value
  end
  if type(value) == "string" then
    return tonumber(value)
  end
  return nil
end

local function text(value)
  if value == nil then
    return "none"
  end
  -- Argo CD opens no string library: tostring, not string.format.
  return tostring(value)
end

local function condition_message(condition)
  if type(condition.message) == "string" and condition.message ~= "" then
    return condition.message
  end
  if type(condition.reason) == "string" and condition.reason ~= "" then
    return condition.reason
  end
  return "Ready is " .. tostring(condition.status)
end

local hs = {}
local generation = nil
if obj.metadata ~= nil then
  generation = number(obj.metadata.generation)
end
local status = obj.status

if status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for Switchyard to report status"
  return hs
end

local observed = number(status.observedGeneration)
if generation ~= nil and observed ~= generation then
  hs.status = "Progressing"
  hs.message = "Waiting for Switchyard to observe generation " .. text(generation) ..
    " (observed: " .. text(observed) .. ")"
  return hs
end

local ready = nil
if type(status.conditions) == "table" then
  for _, condition in ipairs(status.conditions) do
    if condition.type == "Ready" then
      ready = condition
    end
  end
end

if ready == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the Ready condition"
  return hs
end

-- A condition written for an older generation says nothing about this one.
local ready_generation = number(ready.observedGeneration)
if generation ~= nil and ready_generation ~= nil and ready_generation ~= generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the Ready condition of generation " .. text(generation) ..
    " (it describes " .. text(ready_generation) .. ")"
  return hs
end

if ready.status == "True" then
  hs.status = "Healthy"
  hs.message = condition_message(ready)
elseif ready.status == "False" then
  if rollout_reasons[ready.reason] then
    hs.status = "Progressing"
  else
    hs.status = "Degraded"
  end
  hs.message = condition_message(ready)
else
  hs.status = "Progressing"
  hs.message = condition_message(ready)
end
return hs
