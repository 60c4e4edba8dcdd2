from compaction_assets.dagster_host.host import main

main()
