-- Argo CD health check for vllm-operator.dev/VLLMDeployment, read from the conditions the operator writes.
-- Install: key `resource.customizations.health.vllm-operator.dev_VLLMDeployment` in argocd-cm (docs/gitops.md).
-- Argo CD runs this with `obj` set to the live object and only the base, table, string and math libraries.
--
--   no status yet, or status older than metadata.generation   -> Progressing (the operator has not seen the edit)
--   SpecValid=False                                           -> Degraded (refused spec; children left as they were)
--   Degraded=True                                             -> Degraded
--   Ready=True                                                -> Healthy (a Remediating note is kept in the message)
--   Progressing=True, Ready=False/Unknown, nothing else       -> Progressing
local hs = {}

local function find(conditions, wanted)
  if conditions == nil then
    return nil
  end
  for _, c in ipairs(conditions) do
    if c.type == wanted then
      return c
    end
  end
  return nil
end

local function describe(c, fallback)
  if c == nil then
    return fallback
  end
  local text = c.type .. "=" .. tostring(c.status)
  if c.reason ~= nil and c.reason ~= "" then
    text = text .. " (" .. c.reason .. ")"
  end
  if c.message ~= nil and c.message ~= "" then
    text = text .. ": " .. c.message
  end
  return text
end

local status = obj.status
local generation = nil
if obj.metadata ~= nil then
  generation = obj.metadata.generation
end

if status == nil or status.conditions == nil or #status.conditions == 0 then
  hs.status = "Progressing"
  hs.message = "Waiting for vllm-operator to reconcile this VLLMDeployment"
  return hs
end

local conditions = status.conditions
local ready = find(conditions, "Ready")
local observed = status.observedGeneration
if observed == nil and ready ~= nil then
  observed = ready.observedGeneration
end
if generation ~= nil and observed ~= nil and observed < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for vllm-operator to observe generation " .. tostring(generation) ..
    " (status is for " .. tostring(observed) .. ")"
  return hs
end

local spec_valid = find(conditions, "SpecValid")
if spec_valid ~= nil and spec_valid.status == "False" then
  hs.status = "Degraded"
  hs.message = describe(spec_valid, "spec refused")
  return hs
end

local degraded = find(conditions, "Degraded")
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(degraded, "degraded")
  return hs
end

if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = describe(ready, "ready")
  local remediating = find(conditions, "Remediating")
  if remediating ~= nil and remediating.status == "True" then
    hs.message = hs.message .. "; " .. describe(remediating, "remediating")
  end
  return hs
end

local progressing = find(conditions, "Progressing")
hs.status = "Progressing"
if progressing ~= nil and progressing.status == "True" then
  hs.message = describe(progressing, "progressing")
else
  hs.message = describe(ready, "Waiting for the Ready condition")
end
return hs
