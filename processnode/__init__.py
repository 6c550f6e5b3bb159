"""The process node: a node agent for the real control plane whose pods run as local processes, each in a network
namespace of its own (test and benchmark support; the product never imports it and no image contains it)."""
