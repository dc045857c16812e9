-- Argo CD health check for gateway.networking.k8s.io/HTTPRoute, GRPCRoute, TLSRoute,
-- TCPRoute and UDPRoute (their statuses are alike), served by Switchyard.
--
-- Argo CD runs this with the live object in `obj` and reads the returned table:
-- hs.status (Healthy, Progressing, Degraded, Suspended, Missing) and hs.message.
-- Written for Lua 5.1 (Argo CD's interpreter): no string library, no goto.
--
-- Switchyard's parents are those with a switchyard.dev/Served condition; parents of other
-- controllers are left to them.
--
--   Healthy      every parent of Switchyard's has Served True for this generation (or the
--                route has parents, none of them Switchyard's).
--   Progressing  no status yet; Served not written for this generation yet (a change
--                whose Service or ReferenceGrant is not there yet waits for it a while,
--                its earlier generation Served meanwhile); or Served False while the
--                rollout is under way (reason RollingOut or Pending).
--   Degraded     a parent of Switchyard's does not accept the route, cannot resolve its
--                references, or refuses it (Accepted or ResolvedRefs False, Served False
--                for any other reason).

local SERVED = "switchyard.dev/Served"
local rolling_out = { RollingOut = true, Pending = true }

local function number(value)
  if type(value) == "number" then
    return value
  end
  if type(value) == "string" then
    return tonumber(value)
  end
  return nil
end

local function message(condition)
  if type(condition.message) == "string" and condition.message ~= "" then
    return condition.message
  end
  if type(condition.reason) == "string" and condition.reason ~= "" then
    return condition.reason
  end
  return condition.type .. " is " .. tostring(condition.status)
end

local function find(conditions, type_)
  if type(conditions) ~= "table" then
    return nil
  end
  for _, c in ipairs(conditions) do
    if c.type == type_ then
      return c
    end
  end
  return nil
end

local function parent_name(parent)
  local ref = parent.parentRef or {}
  local name = tostring(ref.name)
  if ref.sectionName ~= nil then
    name = name .. "/" .. tostring(ref.sectionName)
  end
  return name
end

local hs = {}
local generation = nil
if obj.metadata ~= nil then
  generation = number(obj.metadata.generation)
end
local parents = nil
if obj.status ~= nil then
  parents = obj.status.parents
end

if type(parents) ~= "table" or #parents == 0 then
  hs.status = "Progressing"
  hs.message = "Waiting for a Gateway to report status"
  return hs
end

local ours = 0
local waiting = nil
for _, parent in ipairs(parents) do
  local served = find(parent.conditions, SERVED)
  if served ~= nil then
    ours = ours + 1
    local name = parent_name(parent)
    local accepted = find(parent.conditions, "Accepted")
    local resolved = find(parent.conditions, "ResolvedRefs")
    if number(served.observedGeneration) ~= generation then
      if resolved ~= nil and resolved.status == "False" and number(resolved.observedGeneration) == generation then
        -- The change waits for what its backendRefs name; an earlier generation serves.
        waiting = waiting or ("Gateway " .. name .. ": " .. message(resolved) .. "; " .. message(served))
      else
        waiting = waiting or ("Waiting for Gateway " .. name .. " to observe generation " .. tostring(generation))
      end
    elseif accepted ~= nil and accepted.status == "False" then
      hs.status = "Degraded"
      hs.message = "Gateway " .. name .. ": " .. message(accepted)
      return hs
    elseif resolved ~= nil and resolved.status == "False" then
      hs.status = "Degraded"
      hs.message = "Gateway " .. name .. ": " .. message(resolved)
      return hs
    elseif served.status ~= "True" then
      if rolling_out[served.reason] then
        waiting = waiting or ("Gateway " .. name .. ": " .. message(served))
      else
        hs.status = "Degraded"
        hs.message = "Gateway " .. name .. ": " .. message(served)
        return hs
      end
    end
  end
end

if waiting ~= nil then
  hs.status = "Progressing"
  hs.message = waiting
  return hs
end
hs.status = "Healthy"
if ours == 0 then
  hs.message = "No Gateway of Switchyard's among the parents"
else
  hs.message = "Served by every Envoy through " .. tostring(ours) .. " Gateway parent(s)"
end
return hs
