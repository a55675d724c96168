from opsupport import cluster, kubeconfig, operator

__all__ = ["cluster", "kubeconfig", "operator"]
