"""The presets, one module per figure or table; importing this package registers them all."""
from . import fig5  # noqa: F401
from . import fig2, fig3, fig4, fig6, fig7, figs2, figs3, figs4, figs5, figs6, figs8, figs9, table1, tables3  # noqa: F401
from . import table1lasso  # noqa: F401  (Table 1, the β-LASSO row)
from . import figs1  # noqa: F401  (App. D.1)
from . import suppa1  # noqa: F401  (Mixer supp. A.1)
