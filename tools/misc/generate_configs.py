"""Write the task configs (every backbone preset x every recipe) from mmvisatt/task_configs.py.

    python tools/misc/generate_configs.py            # write missing or outdated configs
    python tools/misc/generate_configs.py --check    # exit 1 if a config differs from its template
"""
import argparse
import os.path as osp
import sys

from mmvisatt.task_configs import expected_configs, write_configs

CONFIGS = osp.join(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))), 'configs')


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--config-dir', default=CONFIGS)
    parser.add_argument('--check', action='store_true', help='only report configs that differ')
    args = parser.parse_args(argv)
    if args.check:
        stale = [name for name, text in expected_configs(args.config_dir).items()
                 if not osp.isfile(osp.join(args.config_dir, name))
                 or open(osp.join(args.config_dir, name)).read() != text]
        for name in stale:
            print(f'outdated or missing: {name}')
        return 1 if stale else 0
    for name in write_configs(args.config_dir):
        print(f'wrote {name}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
