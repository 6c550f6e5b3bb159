"""The controllers a real cluster runs, for the simulated cluster: Deployment, ReplicaSet, scheduler, kubelet,
EndpointSlice. Each is optional and talks to the API server over HTTP like the real one."""
