"""What each lesson driver runs, by name and in order: its kernels and, on the GPU, the device
helpers they call. The pages show what the dispatch reads from a driver's own code
(``dispatch.functions_of``); these tables are what the tests expect it to read."""
DRIVERS = ["scaled_scores", "attention_with_weights", "attention_with_scores", "weighted_sum", "fused_attention",
           "project_heads", "merge_heads_project", "sinusoidal"]

LESSON_CPU = {
    "scaled_scores": ("scores_kernel", "add_mask_kernel"),
    "attention_with_weights": ("attention_steps", "scores_kernel", "add_mask_kernel", "softmax_kernel",
                               "weighted_sum_kernel"),
    "attention_with_scores": ("attention_steps", "scores_kernel", "add_mask_kernel", "softmax_kernel",
                              "weighted_sum_kernel"),
    "weighted_sum": ("weighted_sum_kernel",),
    "fused_attention": ("fused_attention_kernel",),
    "project_heads": ("project_heads_kernel",),
    "merge_heads_project": ("merge_heads_project_kernel",),
    "sinusoidal": ("sinusoidal_kernel",),
}

LESSON_GPU = {
    "scaled_scores": ("scores_kernel", "add_mask_kernel", "position", "dot", "mask_entry"),
    "attention_with_weights": ("scores_kernel", "add_mask_kernel", "softmax_kernel", "weighted_sum_kernel",
                               "position", "dot", "mask_entry", "softmax_row"),
    "attention_with_scores": ("scores_kernel", "add_mask_kernel", "softmax_kernel", "weighted_sum_kernel",
                              "position", "dot", "mask_entry", "softmax_row"),
    "weighted_sum": ("weighted_sum_kernel", "position", "dot"),
    "fused_attention": ("fused_attention_kernel", "load_rows", "dot", "mask_entry", "online_step"),
    "project_heads": ("project_heads_kernel", "position"),
    "merge_heads_project": ("merge_heads_project_kernel",),
    "sinusoidal": ("sinusoidal_kernel",),
}


def table_of(module) -> dict:
    """``{driver: (function, ...)}`` of the lesson module ``module`` (``core.kernels.cpu`` or ``.gpu``)."""
    names = LESSON_GPU if module.__name__.endswith("gpu") else LESSON_CPU
    return {driver: tuple(getattr(module, name) for name in table) for driver, table in names.items()}


def cpu_kernels(module) -> set:
    """Every compiled function the CPU lesson drivers run."""
    return {f for functions in table_of(module).values() for f in functions}
