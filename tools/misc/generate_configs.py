"""Write the task configs (every backbone preset x every recipe), docs/recipes.md, docs/weights.md,
docs/choosing.md, docs/own_project.md and the model index (model-index.yml, configs/metafiles/*.yml) from
mmvisatt/recipes.py, mmvisatt/task_configs.py and mmvisatt/metafiles.py.

    python tools/misc/generate_configs.py            # write missing or outdated configs and the recipe page
    python tools/misc/generate_configs.py --check    # exit 1 if a config or the page differs from its template
"""
import argparse
import os
import os.path as osp
import sys

from mmvisatt.metafiles import choosing_page, metafiles, own_project_page, weights_page
from mmvisatt.task_configs import expected_configs, recipes_page, write_configs

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIGS = osp.join(ROOT, 'configs')
RECIPES_PAGE = osp.join(ROOT, 'docs', 'recipes.md')
WEIGHTS_PAGE = osp.join(ROOT, 'docs', 'weights.md')
CHOOSING_PAGE = osp.join(ROOT, 'docs', 'choosing.md')
OWN_PROJECT_PAGE = osp.join(ROOT, 'docs', 'own_project.md')
MEMORY_JSON = osp.join(ROOT, 'docs', 'config_memory.json')
MODEL_ZOO_JSON = osp.join(ROOT, 'docs', 'model_zoo.json')


def generated_files(config_dir: str) -> dict:
    """{absolute path: text} of what is written besides the configs: the recipe and weights pages and the model
    index."""
    files = {RECIPES_PAGE: recipes_page(config_dir), WEIGHTS_PAGE: weights_page(config_dir),
             CHOOSING_PAGE: choosing_page(config_dir, MODEL_ZOO_JSON, MEMORY_JSON),
             OWN_PROJECT_PAGE: own_project_page(config_dir)}
    files.update({osp.join(ROOT, path): text for path, text in metafiles(config_dir, MODEL_ZOO_JSON).items()})
    return files


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--config-dir', default=CONFIGS)
    parser.add_argument('--check', action='store_true', help='only report configs that differ')
    args = parser.parse_args(argv)
    if args.check:
        stale = [name for name, text in expected_configs(args.config_dir).items()
                 if not osp.isfile(osp.join(args.config_dir, name))
                 or open(osp.join(args.config_dir, name)).read() != text]
        stale += [path for path, text in generated_files(args.config_dir).items()
                  if not osp.isfile(path) or open(path).read() != text]
        for name in stale:
            print(f'outdated or missing: {name}')
        return 1 if stale else 0
    for name in write_configs(args.config_dir):
        print(f'wrote {name}')
    for path, text in generated_files(args.config_dir).items():
        if not osp.isfile(path) or open(path).read() != text:
            os.makedirs(osp.dirname(path), exist_ok=True)
            with open(path, 'w') as f:
                f.write(text)
            print(f'wrote {path}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
