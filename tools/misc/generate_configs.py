"""Write the task configs (every backbone preset x every recipe) and docs/recipes.md from mmvisatt/recipes.py and
mmvisatt/task_configs.py.

    python tools/misc/generate_configs.py            # write missing or outdated configs and the recipe page
    python tools/misc/generate_configs.py --check    # exit 1 if a config or the page differs from its template
"""
import argparse
import os.path as osp
import sys

from mmvisatt.task_configs import expected_configs, recipes_page, write_configs

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIGS = osp.join(ROOT, 'configs')
RECIPES_PAGE = osp.join(ROOT, 'docs', 'recipes.md')


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--config-dir', default=CONFIGS)
    parser.add_argument('--check', action='store_true', help='only report configs that differ')
    args = parser.parse_args(argv)
    if args.check:
        stale = [name for name, text in expected_configs(args.config_dir).items()
                 if not osp.isfile(osp.join(args.config_dir, name))
                 or open(osp.join(args.config_dir, name)).read() != text]
        page = recipes_page(args.config_dir)
        if not osp.isfile(RECIPES_PAGE) or open(RECIPES_PAGE).read() != page:
            stale.append(RECIPES_PAGE)
        for name in stale:
            print(f'outdated or missing: {name}')
        return 1 if stale else 0
    for name in write_configs(args.config_dir):
        print(f'wrote {name}')
    page = recipes_page(args.config_dir)
    if not osp.isfile(RECIPES_PAGE) or open(RECIPES_PAGE).read() != page:
        with open(RECIPES_PAGE, 'w') as f:
            f.write(page)
        print(f'wrote {RECIPES_PAGE}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
